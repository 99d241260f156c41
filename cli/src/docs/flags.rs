//! Every binary's flags and environment variables, from its own command-line parser:
//! `infera` and its subcommands, `infera-gateway`, `infera-operator`, `infera-kvd`,
//! `infera-sim` and `infera-engine-sidecar` (whose launcher-shaped command line is parsed
//! by hand: its usage text is the reference, and its `node-env` subcommand's parser).

use super::Page;
use super::markdown::{cell, code, table};
use clap::{Arg, Command, CommandFactory};

/// One page per binary.
pub fn pages() -> Vec<Page> {
    vec![
        Page {
            file: "cli-infera.md",
            text: build_page(
                &crate::cli::Cli::command(),
                "The command line users run: a deployment on this machine (`up`), the \
                 benchmarks (`bench`), the earlier operator's manifests converted \
                 (`convert`), the CRDs and these reference pages regenerated.",
            ),
        },
        Page {
            file: "cli-infera-gateway.md",
            text: build_page(
                &infera_gateway::config::GatewayConfig::command(),
                "The gateway. Flag names are the earlier server's; each has an `INFERA_*` \
                 environment variable (a flag wins over its variable, a variable over the \
                 default).",
            ),
        },
        Page {
            file: "cli-infera-operator.md",
            text: build_page(
                &infera_operator::cli::OperatorArgs::command(),
                "The operator, as the chart runs it (the chart sets these from its values).",
            ),
        },
        Page {
            file: "cli-infera-kvd.md",
            text: build_page(
                &infera_kvd::cli::KvdArgs::command(),
                "The KV-cache daemon beside each engine. Sizes are in bytes.",
            ),
        },
        Page {
            file: "cli-infera-sim.md",
            text: build_page(
                &infera_sim::cli::Cli::command(),
                "The engine simulator. Besides these it accepts (and ignores, with a warning) \
                 the other flags of the engine it imitates, so it can be launched exactly as \
                 vLLM, SGLang or ATOM would be.",
            ),
        },
        Page {
            file: "cli-infera-engine-sidecar.md",
            text: sidecar_page(),
        },
    ]
}

/// The sidecar's page: its usage text (the launchers' command-line shape is parsed by
/// hand) and its `node-env` subcommand's parser.
fn sidecar_page() -> String {
    let mut out = String::from("# `infera-engine-sidecar`\n\n");
    out.push_str(
        "The engine sidecar, shaped like the earlier launchers: \
         `infera-engine-sidecar <vllm|sglang|atom|sim> [infera flags] [engine flags]`. \
         Infera's flags are matched by their exact names; every other argument goes to \
         the engine verbatim. Its usage text, as `--help` prints it:\n\n",
    );
    out.push_str("```text\n");
    out.push_str(infera_engine_sidecar::cli::USAGE.trim_end());
    out.push_str("\n```\n\n");
    let node_env = infera_engine_sidecar::node_env::NodeEnvArgs::command();
    command_section(&mut out, &node_env, node_env.get_name());
    out
}

/// A binary's page from its parser (pure): its about text, then a section for the
/// command and one for each subcommand.
pub fn build_page(cmd: &Command, intro: &str) -> String {
    let mut out = format!("# `{}`\n\n{intro}\n\n", cmd.get_name());
    command_section(&mut out, cmd, cmd.get_name());
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        command_section(
            &mut out,
            sub,
            &format!("{} {}", cmd.get_name(), sub.get_name()),
        );
    }
    out
}

fn command_section(out: &mut String, cmd: &Command, name: &str) {
    out.push_str(&format!("## `{name}`\n\n"));
    if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
        out.push_str(&format!("{}\n\n", about.to_string().trim()));
    }
    let args: Vec<&Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && a.get_id() != "help" && a.get_id() != "version")
        .collect();
    if args.is_empty() {
        out.push_str("No flags of its own.\n\n");
        return;
    }
    // Grouped under their help headings, in the parser's order.
    let mut headings: Vec<Option<&str>> = Vec::new();
    for a in &args {
        if !headings.contains(&a.get_help_heading()) {
            headings.push(a.get_help_heading());
        }
    }
    for heading in headings {
        if let Some(h) = heading {
            out.push_str(&format!("**{h}**\n\n"));
        }
        let rows: Vec<Vec<String>> = args
            .iter()
            .filter(|a| a.get_help_heading() == heading)
            .map(|a| arg_row(a))
            .collect();
        out.push_str(&table(
            &["flag", "environment", "default", "description"],
            &rows,
        ));
        out.push('\n');
    }
}

fn arg_row(a: &Arg) -> Vec<String> {
    let value = if !takes_value(a) {
        String::new()
    } else {
        a.get_value_names()
            .map(|v| {
                v.iter()
                    .map(|n| format!("<{n}>"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_else(|| format!("<{}>", a.get_id().as_str().to_uppercase()))
    };
    let mut names: Vec<String> = Vec::new();
    if a.is_positional() {
        names.push(value.clone());
    } else {
        if let Some(long) = a.get_long() {
            names.push(format!("--{long}"));
        }
        if let Some(short) = a.get_short() {
            names.push(format!("-{short}"));
        }
        for alias in a.get_visible_aliases().into_iter().flatten() {
            names.push(format!("--{alias}"));
        }
    }
    let flag = names
        .iter()
        .map(|n| {
            if !a.is_positional() && !value.is_empty() {
                code(&format!("{n} {value}"))
            } else {
                code(n)
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    let env = a
        .get_env()
        .map(|e| code(&e.to_string_lossy()))
        .unwrap_or_default();
    let defaults: Vec<String> = a
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    let default = if defaults.is_empty() || a.is_hide_default_value_set() {
        String::new()
    } else {
        code(&defaults.join(","))
    };
    let mut about = a
        .get_long_help()
        .or(a.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    // Help texts are clap's style (no full stop); the page's cells are sentences.
    let trimmed = about.trim_end();
    if !trimmed.is_empty() && !trimmed.ends_with(['.', '!', '?', ')']) {
        about = format!("{trimmed}.");
    }
    let values: Vec<String> = a
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| match v.get_help() {
            Some(h) => format!(
                "{} ({})",
                code(v.get_name()),
                h.to_string().trim_end_matches('.')
            ),
            None => code(v.get_name()),
        })
        .collect();
    // A flag whose values are true/false states it in its own words.
    if !values.is_empty() && !matches!(values.as_slice(), [t, f] if t == "`true`" && f == "`false`")
    {
        about = format!("{} One of {}.", about.trim(), values.join(", "));
    }
    if a.is_required_set() {
        about = format!("{} Required.", about.trim());
    }
    vec![flag, env, default, cell(about.trim())]
}

/// Whether the flag is given a value (not a switch like `--log-json`).
fn takes_value(a: &Arg) -> bool {
    a.get_action().takes_values()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// A fixture parser.
    #[derive(Debug, Parser)]
    #[command(name = "fixture-bin", about = "Does fixture things.")]
    struct FixtureArgs {
        /// How many widgets.
        #[arg(long, env = "FIXTURE_WIDGETS", default_value_t = 3)]
        widgets: u32,
        /// Turn it on.
        #[arg(long)]
        on: bool,
        /// The mode.
        #[arg(long, value_enum, default_value = "fast")]
        mode: FixtureMode,
        /// Tuning.
        #[arg(long, help_heading = "Tuning")]
        knob: Option<String>,
        /// Hidden.
        #[arg(long, hide = true)]
        secret: Option<String>,
    }

    #[derive(Debug, Clone, clap::ValueEnum)]
    enum FixtureMode {
        /// Quickly.
        Fast,
        Slow,
    }

    #[test]
    fn every_visible_flag_is_a_row_with_env_default_and_values() {
        let page = build_page(&FixtureArgs::command(), "Intro.");
        assert!(
            page.starts_with(
                "# `fixture-bin`\n\nIntro.\n\n## `fixture-bin`\n\nDoes fixture things."
            ),
            "{page}"
        );
        assert!(
            page.contains(
                "| `--widgets <WIDGETS>` | `FIXTURE_WIDGETS` | `3` | How many widgets. |"
            ),
            "{page}"
        );
        assert!(page.contains("| `--on` |  |  | Turn it on. |"), "{page}");
        assert!(
            page.contains(
                "| `--mode <MODE>` |  | `fast` | The mode. One of `fast` (Quickly), `slow`. |"
            ),
            "{page}"
        );
        assert!(page.contains("**Tuning**\n\n| flag |"), "{page}");
        assert!(!page.contains("secret"), "{page}");
    }

    #[test]
    fn the_real_parsers_render() {
        for page in pages() {
            assert!(
                page.text
                    .contains("| flag | environment | default | description |")
                    || page.file == "cli-infera-engine-sidecar.md",
                "{}",
                page.file
            );
        }
    }
}
