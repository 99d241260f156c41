//! Model folders in each layout transformers writes (`testdata/layouts/`, made by its own
//! `save_pretrained` in `make_layouts.py`) render and tokenize as transformers renders
//! and tokenizes them after reading them back: the standalone `chat_template.jinja`, the
//! named templates in `additional_chat_templates/` (`tool_use` chosen for requests with
//! tools), and the older list in `tokenizer_config.json`. A folder with only a tiktoken
//! vocabulary is refused by name.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_prompt::{PromptCodec, PromptError};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn layouts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/layouts")
}

fn expected() -> Value {
    serde_json::from_str(&std::fs::read_to_string(layouts().join("expected.json")).unwrap())
        .unwrap()
}

fn check(codec: &PromptCodec, layout: &str) {
    let expected = expected();
    let cases = expected["layouts"][layout]["cases"].as_object().unwrap();
    assert_eq!(cases.len(), 2, "{layout}: fixture lost cases");
    for (name, want) in cases {
        let body = expected["cases"][name].as_object().unwrap();
        let text = codec
            .render_chat(
                &body["messages"],
                body.get("tools"),
                true,
                &Default::default(),
            )
            .unwrap();
        assert_eq!(
            text,
            want["text"].as_str().unwrap(),
            "{layout} {name}: text"
        );
        let ids: Vec<u32> = serde_json::from_value(want["ids"].clone()).unwrap();
        assert_eq!(
            codec.encode_chat(body).unwrap(),
            ids,
            "{layout} {name}: ids"
        );
    }
}

#[test]
fn each_layout_renders_as_transformers_reads_it() {
    for (layout, names) in [
        ("jinja", vec!["default"]),
        ("named", vec!["default", "tool_use"]),
        ("config_list", vec!["default", "tool_use"]),
    ] {
        let codec = PromptCodec::load(&layouts().join(layout)).unwrap();
        assert_eq!(codec.chat_template_names(), names, "{layout}");
        check(&codec, layout);
    }
}

#[test]
fn the_same_files_given_as_bytes_load_the_same() {
    // What a gateway builds from the files a worker's sidecar serves.
    for layout in ["jinja", "named"] {
        let dir = layouts().join(layout);
        let files: Vec<(String, Vec<u8>)> = expected()["layouts"][layout]["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                let name = f.as_str().unwrap().to_owned();
                let bytes = std::fs::read(dir.join(&name)).unwrap();
                (name, bytes)
            })
            .collect();
        let codec = PromptCodec::from_files(&files, format!("fixture {layout}")).unwrap();
        check(&codec, layout);
    }
}

#[test]
fn the_standalone_template_wins_over_the_configs() {
    let dir = tempfile::tempdir().unwrap();
    let jinja = layouts().join("jinja");
    for name in ["tokenizer.json", "chat_template.jinja"] {
        std::fs::copy(jinja.join(name), dir.path().join(name)).unwrap();
    }
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"chat_template": "fixture config template {{ messages | length }}"}"#,
    )
    .unwrap();
    let codec = PromptCodec::load(dir.path()).unwrap();
    check(&codec, "jinja");
    std::fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();
    let codec = PromptCodec::load(dir.path()).unwrap();
    let text = codec
        .render_chat(&serde_json::json!([{}]), None, true, &Default::default())
        .unwrap();
    assert_eq!(text, "fixture config template 1");
}

#[test]
fn a_tiktoken_only_model_is_named_not_misread() {
    let err = PromptCodec::load(&layouts().join("tiktoken")).unwrap_err();
    assert!(matches!(err, PromptError::TiktokenOnly { .. }), "{err}");
    assert!(err.to_string().contains("no tokenizer.json"), "{err}");
}
