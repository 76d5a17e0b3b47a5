//! The two renderings of the blocks: Markdown and HTML, so they can never disagree.

use std::fmt::Write as _;

use super::Block;

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

pub(super) fn markdown(blocks: &[Block]) -> String {
    let mut out = String::new();
    let mut charts = 0;
    for b in blocks {
        match b {
            Block::H1(t) => {
                let _ = writeln!(out, "# {t}\n");
            }
            Block::H2(t) => {
                let _ = writeln!(out, "## {t}\n");
            }
            Block::P(t) => {
                let _ = writeln!(out, "{t}\n");
            }
            Block::List(items) => {
                for i in items {
                    let _ = writeln!(out, "- {i}");
                }
                out.push('\n');
            }
            Block::Table { head, rows } => {
                let cells: Vec<String> = head.iter().map(|h| md_cell(h)).collect();
                let _ = writeln!(out, "| {} |", cells.join(" | "));
                let _ = writeln!(out, "|{}", "---|".repeat(head.len()));
                for row in rows {
                    let mut cells: Vec<String> = row.iter().map(|c| md_cell(c)).collect();
                    cells.resize(head.len(), String::new());
                    let _ = writeln!(out, "| {} |", cells.join(" | "));
                }
                out.push('\n');
            }
            Block::Chart(svg) if !svg.is_empty() => charts += 1,
            Block::Chart(_) => {}
        }
    }
    if charts > 0 {
        let _ = writeln!(
            out,
            "The charts ({charts}) are in [report.html](report.html), next to this file."
        );
    }
    out
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Escapes, then turns `code` and **bold** into tags.
fn inline(s: &str) -> String {
    let escaped = html_escape(s);
    let mut out = String::with_capacity(escaped.len());
    let (mut code, mut bold) = (false, false);
    let mut rest = escaped.as_str();
    while let Some(c) = rest.chars().next() {
        if c == '`' {
            out.push_str(if code { "</code>" } else { "<code>" });
            code = !code;
            rest = &rest[1..];
        } else if !code && rest.starts_with("**") {
            out.push_str(if bold { "</strong>" } else { "<strong>" });
            bold = !bold;
            rest = &rest[2..];
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    if code {
        out.push_str("</code>");
    }
    if bold {
        out.push_str("</strong>");
    }
    out
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;\
padding:0 1em;color:#222;line-height:1.45}table{border-collapse:collapse;margin:1em 0;\
display:block;overflow-x:auto;font-size:14px}th,td{border:1px solid #ccc;padding:4px 8px;text-align:left}\
td.n{text-align:right;white-space:nowrap}th{background:#f3f3f3}\
code{background:#f3f3f3;padding:0 3px;border-radius:3px}figure{margin:1em 0}\
svg{max-width:100%;height:auto}h2{margin-top:2em;border-bottom:1px solid #ddd}";

/// Cells that hold a measurement are right-aligned, text stays left-aligned.
fn is_number(cell: &str) -> bool {
    cell.starts_with(|c: char| c.is_ascii_digit() || "+−–".contains(c))
}

pub(super) fn html(blocks: &[Block]) -> String {
    let mut out = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>distlock benchmark report</title><style>{STYLE}</style></head><body>\n"
    );
    for b in blocks {
        match b {
            Block::H1(t) => {
                let _ = writeln!(out, "<h1>{}</h1>", inline(t));
            }
            Block::H2(t) => {
                let _ = writeln!(out, "<h2>{}</h2>", inline(t));
            }
            Block::P(t) => {
                let _ = writeln!(out, "<p>{}</p>", inline(t));
            }
            Block::List(items) => {
                out.push_str("<ul>");
                for i in items {
                    let _ = write!(out, "<li>{}</li>", inline(i));
                }
                out.push_str("</ul>\n");
            }
            Block::Table { head, rows } => {
                out.push_str("<table><thead><tr>");
                for h in head {
                    let _ = write!(out, "<th>{}</th>", inline(h));
                }
                out.push_str("</tr></thead><tbody>");
                for row in rows {
                    out.push_str("<tr>");
                    for c in row {
                        let class = if is_number(c) { " class=\"n\"" } else { "" };
                        let _ = write!(out, "<td{class}>{}</td>", inline(c));
                    }
                    out.push_str("</tr>");
                }
                out.push_str("</tbody></table>\n");
            }
            Block::Chart(svg) if !svg.is_empty() => {
                let _ = writeln!(out, "<figure>{svg}</figure>");
            }
            Block::Chart(_) => {}
        }
    }
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::table;

    #[test]
    fn inline_markup_becomes_tags_after_escaping() {
        assert_eq!(
            inline("run `a<b` **now**"),
            "run <code>a&lt;b</code> <strong>now</strong>"
        );
        assert_eq!(inline("`x**y`"), "<code>x**y</code>");
    }

    #[test]
    fn markdown_tables_pad_short_rows_and_escape_pipes() {
        let md = markdown(&[table(&["a", "b"], vec![vec!["x|y".into()]])]);
        assert!(md.contains("| a | b |\n|---|---|\n| x\\|y |  |\n"), "{md}");
    }
}
