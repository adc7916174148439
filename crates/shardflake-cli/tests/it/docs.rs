//! Every console example in the README and the user guides, run as a reader
//! would run it, and compared with what the page shows.
//!
//! A page's ```console blocks are one shell session: `$ ` starts a command
//! (continued by lines ending in `\`, or by lines starting with `>`, the
//! shell's second prompt, as in a here-document); the lines up to the next
//! command are what it prints, stdout and stderr together. Output is matched
//! with snapbox: `[..]` stands for any text within a line, `...` on a line of
//! its own for any number of lines (times, ids and ports change every run).
//!
//! The session runs in a fresh temporary directory, never the checkout, with
//! the `shardflake` under test first on `PATH` and `$SF` set to this
//! repository (the pages say so: `$SF` is the reader's clone). Pages that
//! start servers start them with the project's scripts and stop them at the
//! end; whatever a failed page leaves running is killed with its process
//! group.

use std::fmt::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use snapbox::IntoData;

/// One `$ ` command of a page and the output the page shows for it.
struct Example {
    line: usize,
    command: String,
    output: String,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The ```console blocks of a Markdown page, in order.
fn examples(page: &str) -> Vec<Example> {
    let mut examples: Vec<Example> = Vec::new();
    let mut in_console = false;
    let mut continued = false;
    for (n, line) in page.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            in_console = !in_console && trimmed == "```console";
            continued = false;
            continue;
        }
        if !in_console {
            continue;
        }
        if let Some(command) = line.strip_prefix("$ ") {
            examples.push(Example {
                line: n + 1,
                command: command.to_owned(),
                output: String::new(),
            });
            continued = command.ends_with('\\');
        } else if let Some(last) = examples.last_mut() {
            let second_prompt = line == ">" || line.starts_with("> ");
            if continued || (last.output.is_empty() && second_prompt) {
                let rest = line
                    .strip_prefix('>')
                    .map_or(line, |r| r.strip_prefix(' ').unwrap_or(r));
                last.command.push('\n');
                last.command.push_str(rest);
                continued = line.ends_with('\\');
            } else {
                last.output.push_str(line);
                last.output.push('\n');
            }
        }
    }
    examples
}

const MARK: &str = "@@shardflake-docs-example-end@@";

/// Runs a page's examples as one bash session and checks each one's output.
fn run_page(relative: &str, timeout: Duration) {
    let path = repo().join(relative);
    let page = std::fs::read_to_string(&path).unwrap();
    let examples = examples(&page);
    assert!(!examples.is_empty(), "{relative} has no console example");

    let mut script = String::from("exec 2>&1\n");
    for example in &examples {
        writeln!(script, "{}\nprintf '\\n{MARK}\\n'", example.command).unwrap();
    }
    let dir = tempfile_dir(relative);
    wait_for_default_ports();
    let bin = Path::new(crate::shardflake_bin())
        .parent()
        .unwrap()
        .to_owned();
    let path_var = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new("timeout")
        .arg(timeout.as_secs().to_string())
        .args(["bash", "-c", &script])
        .current_dir(&dir)
        .env("PATH", path_var)
        .env("SF", repo().canonicalize().unwrap())
        .env("NO_COLOR", "1")
        .env_remove("SHARDFLAKE_TOPOLOGY")
        .env_remove("SHARDFLAKE_CONFIG")
        .stdout(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = child.id() as i32;
    let mut stdout = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    let status = child.wait().unwrap();
    // Whatever the page left behind (a server it failed to stop).
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    let logs = log_tails(&dir);
    let _ = std::fs::remove_dir_all(&dir);

    let outputs: Vec<&str> = stdout.split(&format!("\n{MARK}\n")).collect();
    let mut failures = String::new();
    for (i, example) in examples.iter().enumerate() {
        let Some(actual) = outputs.get(i) else {
            writeln!(
                failures,
                "{relative}:{}: `{}` never finished (session ended with {status})",
                example.line, example.command
            )
            .unwrap();
            break;
        };
        let actual = with_final_newline(actual);
        let name = format!("{relative}:{}", example.line);
        if let Err(err) = snapbox::Assert::new().normalize_paths(false).try_eq(
            Some(&name),
            actual.into_data(),
            with_final_newline(&example.output).into_data(),
        ) {
            writeln!(failures, "{name}: `{}`\n{err}", example.command).unwrap();
        }
    }
    assert!(failures.is_empty(), "{failures}{logs}");
}

/// Waits (bounded) until the service's default ports can be bound: pages
/// start `shardflake serve` on 8080 and 50051 as a reader would, and 50051
/// lies in Linux's ephemeral range, where another test's listener on port 0
/// may sit for a while. Pages that start several nodes use ports below that
/// range.
fn wait_for_default_ports() {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while ["127.0.0.1:8080", "127.0.0.1:50051"]
        .iter()
        .any(|addr| std::net::TcpListener::bind(addr).is_err())
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The last lines of each `*.log` the page wrote in its scratch directory
/// (a server's, a node's), for a failure's message: the directory is gone
/// by then.
fn log_tails(dir: &Path) -> String {
    let mut out = String::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(20)..];
        writeln!(
            out,
            "\n--- last lines of {} ---\n{}",
            path.file_name().unwrap_or_default().to_string_lossy(),
            tail.join("\n")
        )
        .unwrap();
    }
    out
}

/// Text without trailing blank lines, ending in one newline unless empty.
fn with_final_newline(text: &str) -> String {
    let text = text.trim_end_matches('\n');
    if text.is_empty() {
        String::new()
    } else {
        format!("{text}\n")
    }
}

fn tempfile_dir(relative: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "shardflake-docs-{}-{}",
        relative.replace('/', "-"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn parser_reads_commands_continuations_and_output() {
    let page = "text\n```console\n$ echo a \\\n  b\na b\n$ cat <<EOF\n> x \\\n>\n> EOF\nx\n```\n```sh\n$ not run\n```\n";
    let got = examples(page);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].command, "echo a \\\n  b");
    assert_eq!(got[0].output, "a b\n");
    assert_eq!(got[1].command, "cat <<EOF\nx \\\n\nEOF");
    assert_eq!(got[1].output, "x\n");
}

#[test]
fn readme() {
    run_page("README.md", Duration::from_secs(120));
}

#[test]
fn guide_service() {
    run_page("docs/guide/service.md", Duration::from_secs(120));
}

#[test]
fn guide_etcd() {
    run_page("docs/guide/etcd.md", Duration::from_secs(180));
}

#[test]
fn guide_postgres() {
    run_page("docs/guide/postgres.md", Duration::from_secs(240));
}

#[test]
fn guide_adopting() {
    run_page("docs/guide/adopting.md", Duration::from_secs(180));
}

#[test]
fn guide_mariadb() {
    run_page("docs/guide/mariadb.md", Duration::from_secs(180));
}

#[test]
fn guide_tickets() {
    run_page("docs/guide/tickets.md", Duration::from_secs(180));
}

#[test]
fn guide_time() {
    run_page("docs/guide/time.md", Duration::from_secs(120));
}

#[test]
fn guide_operations() {
    run_page("docs/guide/operations.md", Duration::from_secs(120));
}

/// The pages above; a new page with console examples must be added here.
const PAGES: &[&str] = &[
    "README.md",
    "docs/guide/adopting.md",
    "docs/guide/etcd.md",
    "docs/guide/mariadb.md",
    "docs/guide/operations.md",
    "docs/guide/postgres.md",
    "docs/guide/service.md",
    "docs/guide/tickets.md",
    "docs/guide/time.md",
];

#[test]
fn every_page_with_console_examples_is_run() {
    let mut pages = vec!["README.md".to_owned()];
    for dir in ["docs", "docs/guide", "docs/deploy"] {
        for entry in std::fs::read_dir(repo().join(dir)).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if name.ends_with(".md") {
                pages.push(format!("{dir}/{name}"));
            }
        }
    }
    for page in pages {
        let text = std::fs::read_to_string(repo().join(&page)).unwrap();
        if text.contains("```console") {
            assert!(
                PAGES.contains(&page.as_str()),
                "{page} has console examples no test runs"
            );
        }
    }
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces
/// to hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every relative link of the user-facing pages points at a file that
/// exists and, with `#anchor`, at one of its headings.
#[test]
fn links_between_pages_resolve() {
    let mut pages = vec![
        PathBuf::from("README.md"),
        PathBuf::from("ARCHITECTURE.md"),
        PathBuf::from("CONTRIBUTING.md"),
    ];
    for dir in ["docs", "docs/guide"] {
        for entry in std::fs::read_dir(repo().join(dir)).unwrap() {
            let path = Path::new(dir).join(entry.unwrap().file_name());
            if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(repo().join(page)).unwrap();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
            let resolved = if file.is_empty() {
                repo().join(page)
            } else {
                repo().join(page.parent().unwrap()).join(file)
            };
            if !resolved.exists() {
                broken.push(format!("{}: {target}: no such file", page.display()));
                continue;
            }
            if !fragment.is_empty() {
                let linked = std::fs::read_to_string(&resolved).unwrap_or_default();
                let found = linked
                    .lines()
                    .filter_map(|l| l.strip_prefix('#'))
                    .map(|h| anchor(h.trim_start_matches('#')))
                    .any(|a| a == fragment);
                if !found {
                    broken.push(format!("{}: {target}: no such heading", page.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
