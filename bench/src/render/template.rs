//! The report's fixed prose, kept in `report.md.tmpl` so that the code only says where it goes
//! and fills in the numbers. The file is split into parts (`<!-- part NAME -->`), each a few
//! headings, paragraphs and list items; see the file's own header.

use std::fmt::Display;

use super::Block;

const TEMPLATE: &str = include_str!("report.md.tmpl");

/// The values of a part's `{{name}}` placeholders.
pub(super) type Vars<'a> = &'a [(&'a str, &'a dyn Display)];

/// Part `name` as blocks, with `vars` filled in.
pub(super) fn blocks(name: &str, vars: Vars<'_>) -> Vec<Block> {
    let fill = |s: String| {
        vars.iter().fold(s, |s, (k, v)| {
            s.replace(&format!("{{{{{k}}}}}"), &v.to_string())
        })
    };
    parse(part(name))
        .into_iter()
        .map(|b| match b {
            Block::H1(t) => Block::H1(fill(t)),
            Block::H2(t) => Block::H2(fill(t)),
            Block::P(t) => Block::P(fill(t)),
            Block::List(items) => Block::List(items.into_iter().map(fill).collect()),
            other => other,
        })
        .collect()
}

/// Part `name`, a single paragraph, as a line of text for a sentence built in code.
pub(super) fn text(name: &str, vars: Vars<'_>) -> String {
    match blocks(name, vars).as_slice() {
        [Block::P(t)] => t.clone(),
        _ => panic!("template part {name:?} is not one paragraph"),
    }
}

/// The lines of part `name`. The template is compiled in, so a missing part is a bug that the
/// rendering tests meet.
fn part(name: &str) -> &'static str {
    let start = format!("<!-- part {name} -->\n");
    let Some(at) = TEMPLATE.find(&start) else {
        panic!("report.md.tmpl has no part {name:?}");
    };
    let rest = &TEMPLATE[at + start.len()..];
    &rest[..rest.find("<!-- part ").unwrap_or(rest.len())]
}

/// Headings, paragraphs and list items; consecutive items make one list.
fn parse(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut list: Vec<String> = Vec::new();
    // The paragraph or item being read, and whether it is an item.
    let mut open: Option<(String, bool)> = None;
    let close =
        |open: &mut Option<(String, bool)>, list: &mut Vec<String>, out: &mut Vec<_>| match open
            .take()
        {
            Some((t, true)) => list.push(t),
            Some((t, false)) => out.push(Block::P(t)),
            None => {}
        };
    for line in text.lines().map(str::trim_end) {
        let heading = line.strip_prefix("# ").map(|t| Block::H1(t.into()));
        let heading = heading.or_else(|| line.strip_prefix("## ").map(|t| Block::H2(t.into())));
        let item = line.strip_prefix("- ");
        if line.is_empty() {
            close(&mut open, &mut list, &mut out);
            continue;
        }
        if heading.is_some() || item.is_some() || open.is_none() {
            close(&mut open, &mut list, &mut out);
            if item.is_none() && !list.is_empty() {
                out.push(Block::List(std::mem::take(&mut list)));
            }
        }
        match (heading, item, &mut open) {
            (Some(h), _, _) => out.push(h),
            (None, Some(t), _) => open = Some((t.to_string(), true)),
            (None, None, Some((t, _))) => {
                t.push(' ');
                t.push_str(line.trim_start());
            }
            (None, None, None) => open = Some((line.to_string(), false)),
        }
    }
    close(&mut open, &mut list, &mut out);
    if !list.is_empty() {
        out.push(Block::List(list));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::markup::markdown;

    #[test]
    fn parts_become_headings_paragraphs_and_lists() {
        let md = markdown(&parse(
            "## Title\n\nOne\nparagraph.\n- an item\n  wrapped\n- another\n## Next\n",
        ));
        assert_eq!(
            md,
            "## Title\n\nOne paragraph.\n\n- an item wrapped\n- another\n\n## Next\n\n"
        );
    }

    #[test]
    fn placeholders_are_filled() {
        let line = text("etcd-requests", &[("n", &"2.5")]);
        assert!(
            line.starts_with("it received 2.5 requests per grant"),
            "{line}"
        );
    }
}
