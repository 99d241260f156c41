//! The earlier containers' command lines, read as the earlier images ran them: an
//! optional wrapper (`/overlay/bin/infera-exec`, `sh -c "exec ..."`), then
//! `python3 -m infera.engine.<engine>`, `infera.server` or `infera.kvd`, then flags.
//! Flags are kept as groups of the words they were written as, so what is not mapped
//! to a field is passed on verbatim.

/// An earlier program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// `infera.engine.sglang`, `.vllm` or `.atom`: an engine launcher.
    Engine(&'static str),
    /// `infera.server`: the router.
    Server,
    /// `infera.kvd`: the KV-cache daemon.
    Kvd,
}

/// One flag and its values (or a positional word, with an empty name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flag {
    /// `--tp-size`, `-tp`; empty for a positional word.
    pub name: String,
    /// The values after it (`--cuda-graph-bs 1 2 4` has three), or after `=`.
    pub values: Vec<String>,
    /// The words as written, to pass on verbatim.
    pub words: Vec<String>,
}

impl Flag {
    /// The first value, if any.
    pub fn value(&self) -> Option<&str> {
        self.values.first().map(String::as_str)
    }
}

/// A parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// What runs.
    pub program: Program,
    /// Its flags, in order.
    pub flags: Vec<Flag>,
    /// Words before the interpreter (`/overlay/bin/infera-exec`), if any.
    pub wrapper: Vec<String>,
}

/// Reads `words` (a container's command followed by its args) as an earlier program.
/// The error says why it is not one.
pub fn parse_invocation(words: &[String]) -> Result<Invocation, String> {
    let words = unwrap_shell(words)?;
    let Some(at) = words
        .windows(2)
        .position(|w| w[0] == "-m" && module(&w[1]).is_some())
    else {
        return Err(format!(
            "not an earlier Infera program (python3 -m infera.engine.<engine>, infera.server or infera.kvd): {}",
            words.join(" ")
        ));
    };
    let program = module(&words[at + 1]).ok_or_else(|| "unknown module".to_owned())?;
    let wrapper = words[..at]
        .iter()
        .filter(|w| {
            !w.rsplit('/')
                .next()
                .is_some_and(|p| p.starts_with("python"))
        })
        .cloned()
        .collect();
    Ok(Invocation {
        program,
        flags: group_flags(&words[at + 2..]),
        wrapper,
    })
}

fn module(name: &str) -> Option<Program> {
    let name = name.strip_suffix(".__main__").unwrap_or(name);
    match name {
        "infera.engine.sglang" => Some(Program::Engine("sglang")),
        "infera.engine.vllm" => Some(Program::Engine("vllm")),
        "infera.engine.atom" => Some(Program::Engine("atom")),
        "infera.server" => Some(Program::Server),
        "infera.kvd" => Some(Program::Kvd),
        _ => None,
    }
}

/// `sh -c "exec python3 -m ..."` as the words of its one command.
fn unwrap_shell(words: &[String]) -> Result<Vec<String>, String> {
    let shell = words
        .first()
        .and_then(|w| w.rsplit('/').next())
        .is_some_and(|p| matches!(p, "sh" | "bash" | "dash"));
    if !shell || words.get(1).map(String::as_str) != Some("-c") {
        return Ok(words.to_vec());
    }
    let script = words.get(2).map(String::as_str).unwrap_or_default();
    let mut split = shlex::split(script)
        .ok_or_else(|| format!("a shell script that does not split into words: {script}"))?;
    let compound = split.iter().any(|w| {
        matches!(w.as_str(), "&&" | "||" | "|" | ";" | "&")
            || w.ends_with(';')
            || w.starts_with('>')
    });
    if compound || script.contains('\n') && script.trim().lines().count() > 1 {
        return Err(format!(
            "a shell script of more than one command: {}",
            script.trim()
        ));
    }
    if split.first().map(String::as_str) == Some("exec") {
        split.remove(0);
    }
    Ok(split)
}

fn is_flag(word: &str) -> bool {
    let mut chars = word.chars();
    chars.next() == Some('-')
        && chars
            .next()
            .is_some_and(|c| c == '-' || c.is_ascii_alphabetic())
}

/// Groups words into flags with the values that follow them.
pub fn group_flags(words: &[String]) -> Vec<Flag> {
    let mut flags: Vec<Flag> = Vec::new();
    for word in words {
        if is_flag(word) {
            let (name, values) = match word.split_once('=') {
                Some((name, value)) if name.starts_with("--") => {
                    (name.to_owned(), vec![value.to_owned()])
                }
                _ => (word.clone(), Vec::new()),
            };
            flags.push(Flag {
                name,
                values,
                words: vec![word.clone()],
            });
            continue;
        }
        match flags.last_mut() {
            Some(f) if !f.name.is_empty() && !f.words[0].contains('=') => {
                f.values.push(word.clone());
                f.words.push(word.clone());
            }
            _ => flags.push(Flag {
                name: String::new(),
                values: vec![word.clone()],
                words: vec![word.clone()],
            }),
        }
    }
    flags
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &[&str]) -> Vec<String> {
        s.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn finds_the_program_behind_wrappers() {
        let inv = parse_invocation(&words(&[
            "/overlay/bin/infera-exec",
            "python3",
            "-m",
            "infera.engine.vllm",
            "--model",
            "/models/q",
            "--enable-prefix-caching",
            "--cuda-graph-sizes",
            "1",
            "2",
            "--max-model-len=4096",
        ]))
        .unwrap();
        assert_eq!(inv.program, Program::Engine("vllm"));
        let names: Vec<&str> = inv.flags.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "--model",
                "--enable-prefix-caching",
                "--cuda-graph-sizes",
                "--max-model-len"
            ]
        );
        assert_eq!(inv.flags[2].values, ["1", "2"]);
        assert_eq!(inv.flags[3].values, ["4096"]);
        assert_eq!(inv.flags[3].words, ["--max-model-len=4096"]);
    }

    #[test]
    fn reads_one_command_shell_scripts_and_refuses_longer_ones() {
        let inv = parse_invocation(&words(&[
            "/bin/sh",
            "-c",
            "exec python3 -m infera.engine.sglang --tp-size 2 --node-rank \"$LWS_WORKER_INDEX\"",
        ]))
        .unwrap();
        assert_eq!(inv.program, Program::Engine("sglang"));
        assert_eq!(inv.flags[1].values, ["$LWS_WORKER_INDEX"]);
        let err = parse_invocation(&words(&[
            "bash",
            "-c",
            "sleep 5; python3 -m infera.engine.sglang",
        ]))
        .unwrap_err();
        assert!(err.contains("more than one command"), "{err}");
        let err = parse_invocation(&words(&["sleep", "infinity"])).unwrap_err();
        assert!(err.contains("not an earlier Infera program"), "{err}");
    }

    #[test]
    fn negative_numbers_are_values() {
        let flags = group_flags(&words(&["--offset", "-1", "-tp", "8"]));
        assert_eq!(flags[0].values, ["-1"]);
        assert_eq!(flags[1].name, "-tp");
    }
}
