//! The book's generated reference pages (`docs/src/reference/`) are what the code
//! generates: the CRDs' fields, every binary's flags, the metric families, the wire
//! contracts.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

#[tokio::test]
async fn checked_in_reference_pages_match_the_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let pages = infera::docs::pages(&root).await.unwrap();
    let dir = root.join(infera::docs::REFERENCE_DIR);
    let stale = infera::docs::stale(&dir, &pages);
    assert!(
        stale.is_empty(),
        "out of date: {stale:?}; run `cargo run -p infera -- docs` from the repository root"
    );
}

#[tokio::test]
async fn check_mode_names_stale_pages_and_write_mode_fixes_them() {
    let repo = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(repo.path().join("proto")).unwrap();
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/src");
    std::os::unix::fs::symlink(&proto, repo.path().join("proto/src")).unwrap();
    let err = infera::docs::run(repo.path(), true)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("inferadeployment.md") && err.contains("metrics.md"),
        "{err}"
    );
    infera::docs::run(repo.path(), false).await.unwrap();
    infera::docs::run(repo.path(), true).await.unwrap();
    let page =
        std::fs::read_to_string(repo.path().join("docs/src/reference/cli-infera-gateway.md"))
            .unwrap();
    assert!(page.starts_with(infera::docs::GENERATED_NOTICE), "{page}");
    assert!(page.contains("`--router-policy"), "{page}");
}
