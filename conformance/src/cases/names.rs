//! Lock names: what is rejected before any I/O, and which distinct names stay distinct.

use super::*;

pub(super) async fn empty_name_is_invalid_argument(cx: Ctx) {
    rejects_name(&cx, "").await;
}

pub(super) async fn name_over_255_bytes_is_invalid_argument_and_255_bytes_works(cx: Ctx) {
    let p = cx.name("");
    let ok = format!("{p}{}", "n".repeat(255 - p.len()));
    assert_eq!(ok.len(), 255);
    rejects_name(&cx, &format!("{ok}n")).await;
    // Multi-byte: 255 bytes made of 3-byte characters after the prefix, padded with ASCII.
    let room = 255 - p.len();
    let wide = format!("{p}{}{}", "€".repeat(room / 3), "w".repeat(room % 3));
    assert_eq!(wide.len(), 255);
    distinct_working_locks(&cx, &[ok, wide]).await;
}

pub(super) async fn name_with_control_character_is_invalid_argument(cx: Ctx) {
    for bad in ["a\nb", "tab\there", "esc\u{1b}", "del\u{7f}", "c1\u{85}"] {
        rejects_name(&cx, &cx.name(bad)).await;
    }
}

pub(super) async fn name_with_nul_is_invalid_argument(cx: Ctx) {
    rejects_name(&cx, &cx.name("nul\0byte")).await;
    rejects_name(&cx, "\0").await;
}

pub(super) async fn whitespace_only_name_is_invalid_argument(cx: Ctx) {
    for bad in [" ", "   ", "\u{3000}", "\u{a0}"] {
        rejects_name(&cx, bad).await;
    }
}

pub(super) async fn slash_and_dot_names_are_distinct_working_locks(cx: Ctx) {
    let mut names: Vec<String> = [
        "", "/", "a/b", "a", "a/", "/a", ".", "..", "a/./b", "a/../b", "a//b",
    ]
    .iter()
    .map(|s| cx.name(s))
    .collect();
    // Exactly these names matter to path-based backends; any leftover holder of them from an
    // earlier crashed run has a short lease, hence `lock` with a wait rather than `try_lock`.
    names.extend(["/", ".", "..", "zookeeper"].map(String::from));
    // Two suite runs against one server would race for those exact names, so runs take turns
    // through a lock of the backend itself.
    let turns = cx.client().await;
    let turn = turns
        .lock("distlock-conformance: exact names", Duration::from_secs(60))
        .await
        .expect("waiting for another suite run to finish with the exact names");
    distinct_working_locks(&cx, &names).await;
    assert!(turn.release().await.unwrap());
}

pub(super) async fn unicode_names_are_distinct_working_locks(cx: Ctx) {
    // "é" precomposed and decomposed are different strings, so different locks.
    let names: Vec<String> = [
        "ключ", "锁", "🔒", "\u{e9}", "e\u{301}", "{tag}", "*?[]", "%2F", "'\"`;--",
    ]
    .iter()
    .map(|s| cx.name(s))
    .collect();
    distinct_working_locks(&cx, &names).await;
}

pub(super) async fn names_are_case_sensitive(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let (upper, lower) = (cx.name("Lock"), cx.name("lock"));
    let ga = must_lock(&a, &upper).await;
    let gb = b
        .try_lock(&lower)
        .await
        .unwrap()
        .expect("\"lock\" must be a different lock from \"Lock\"");
    assert_eq!(holder_of(&a, &upper).await.as_ref(), Some(ga.owner()));
    assert_eq!(holder_of(&a, &lower).await.as_ref(), Some(gb.owner()));
    assert!(ga.release().await.unwrap());
    assert!(gb.release().await.unwrap());
}
