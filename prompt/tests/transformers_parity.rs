//! Rendering and tokenization equal Hugging Face `transformers` for real templates
//! (Qwen3's full template with tools and `tojson`; Llama 3.1's short variant). The
//! expected outputs were produced by `testdata/make_chat_fixtures.py`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_prompt::PromptCodec;
use infera_testkit::model_files::{FixtureModel, model_dir};
use serde_json::Value;

fn fixtures() -> Value {
    serde_json::from_str(include_str!("../testdata/chat_fixtures.json")).unwrap()
}

fn check(model: FixtureModel) {
    let codec = PromptCodec::load(&model_dir(model).unwrap()).unwrap();
    assert!(codec.has_chat_template());
    let fixtures = fixtures();
    let cases = &fixtures["cases"];
    let expected = fixtures["models"][model.name()].as_object().unwrap();
    // Qwen3: 20 generated conversations (system prompts, turns, unicode, tools, tool
    // calls, thinking off) plus the named cases.
    let minimum = if model == FixtureModel::Qwen3 { 26 } else { 6 };
    assert!(
        expected.len() >= minimum,
        "fixture lost cases for {}",
        model.name()
    );
    for (name, want) in expected {
        let want_ids: Vec<u32> = serde_json::from_value(want["ids"].clone()).unwrap();
        let got_ids = match name.as_str() {
            "completion" => codec
                .encode_completion(want["text"].as_str().unwrap())
                .unwrap(),
            "canary" => codec.encode(want["text"].as_str().unwrap(), false).unwrap(),
            _ => {
                let body = &cases[name];
                let extra = body
                    .get("chat_template_kwargs")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                let text = codec
                    .render_chat(&body["messages"], body.get("tools"), true, &extra)
                    .unwrap();
                assert_eq!(
                    text,
                    want["text"].as_str().unwrap(),
                    "{} {name}: rendered text",
                    model.name()
                );
                codec.encode_chat(body.as_object().unwrap()).unwrap()
            }
        };
        assert_eq!(got_ids, want_ids, "{} {name}: token ids", model.name());
    }
}

#[test]
fn qwen3_matches_transformers() {
    check(FixtureModel::Qwen3);
}

#[test]
fn llama3_1_matches_transformers() {
    check(FixtureModel::Llama31);
}
