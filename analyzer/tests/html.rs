//! The HTML report (`--html`), loaded in a real headless browser (Debian's
//! chromium, which .ci/run installs): nothing fails, the chart and every
//! flamegraph are drawn, the leak table lists the known leaks, and a time
//! range picked on the chart shows what it left live. A screenshot is kept
//! at target/tmp/html-report.png.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The page's DOM after its script ran, and chromium's log.
fn dom(page: &Path, hash: &str, profile: &Path) -> Option<(String, String)> {
    let out = chromium(profile)?.arg("--dump-dom").arg(format!("file://{}{hash}", page.display())).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Some((String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned()))
}

/// The value of attribute `name` in the element with id `id`.
fn attr(dom: &str, id: &str, name: &str) -> Option<String> {
    let start = dom.find(&format!("id=\"{id}\""))?;
    let tag_start = dom[..start].rfind('<')?;
    let tag = &dom[tag_start..tag_start + dom[tag_start..].find('>')?];
    let key = format!("{name}=\"");
    let at = tag.find(&key)? + key.len();
    Some(tag[at..at + tag[at..].find('"')?].to_owned())
}

/// (data-function, data-bytes) of the rows of the element with id `id`.
fn rows(dom: &str, id: &str) -> Vec<(String, u64)> {
    let Some(start) = dom.find(&format!("id=\"{id}\"")) else { return vec![] };
    let table = &dom[start..start + dom[start..].find("</table>").unwrap_or(0)];
    table
        .split("<tr data-function=\"")
        .skip(1)
        .map(|r| {
            let (f, rest) = r.split_once('"').unwrap();
            let b = rest.split("data-bytes=\"").nth(1).and_then(|b| b.split('"').next()).unwrap_or("0");
            (f.to_owned(), b.parse().unwrap())
        })
        .collect()
}

fn markers_of(trace: &Path) -> Vec<(String, f64)> {
    let out = Command::new(mtrace()).args(["report", "--markers", "--json"]).arg(trace).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| (m["name"].as_str().unwrap().to_owned(), m["time_ns"].as_u64().unwrap() as f64 / 1e9))
        .collect()
}

/// `mtrace run --html` of phases.c in scratch folder `name`: (folder, page, trace).
fn page(name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let dir = scratch(name);
    let prog = build("phases.c", &dir.join("phases"), &["-g", "-O0"]);
    let page = dir.join("page.html");
    let traces = dir.join("t");
    let out = Command::new(mtrace())
        .args(["run", "-o", "/dev/null", "--html"])
        .arg(&page)
        .arg("--trace-dir")
        .arg(&traces)
        .arg("--")
        .arg(&prog)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let trace = std::fs::read_dir(&traces).unwrap().next().unwrap().unwrap().path();
    (dir, page, trace)
}

#[test]
fn the_page_is_self_contained_and_private() {
    let (_, page, _) = page("html-private");
    let html = std::fs::read_to_string(&page).unwrap();
    // Nothing is fetched: no links, no sources, no address but SVG's namespace.
    for bad in ["<link", " src=", "@import", "url("] {
        assert!(!html.contains(bad), "{bad}");
    }
    let addresses: Vec<&str> = html.match_indices("http").map(|(i, _)| &html[i..(i + 40).min(html.len())]).collect();
    assert!(addresses.iter().all(|a| a.starts_with("http://www.w3.org/2000/svg")), "{addresses:?}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&page).unwrap().permissions().mode() & 0o777, 0o600);
}

#[test]
fn the_page_draws_in_a_browser_and_a_range_shows_what_it_left() {
    let (dir, page, trace) = page("html-browser");
    let profile = dir.join("chromium");
    let Some((plain, log)) = dom(&page, "", &profile) else {
        cannot_run("chromium is not installed");
        return;
    };
    // No script error: the page's own check, and chromium's console.
    assert_eq!(attr(&plain, "status", "data-ok").as_deref(), Some("1"), "{plain}");
    assert_eq!(attr(&plain, "status", "data-flames").as_deref(), Some("1111"), "{plain}");
    assert!(!log.contains("CONSOLE"), "{log}");
    assert!(plain.contains("<pre id=\"errors\"></pre>"), "{plain}");
    // The leaks, definitely lost (the scan ran), largest first.
    assert_eq!(
        rows(&plain, "leak-table"),
        vec![("phase_two".to_owned(), 15_000), ("phase_one".to_owned(), 10_000), ("phase_three".to_owned(), 7_000)]
    );
    assert!(plain.contains("class=\"kind-definite\">definite<"), "{plain}");
    // No range picked yet.
    assert_eq!(attr(&plain, "range", "hidden").as_deref(), Some(""), "{plain}");

    // Phase two, from its marker to just before phase three's: its five
    // blocks; not phase one's (before it), its buffer (freed) or phase three's.
    let m = markers_of(&trace);
    let at = |name: &str| m.iter().find(|(n, _)| n == name).unwrap().1;
    // The start rounded down, never past the marker: phase two's first
    // block comes microseconds after it (rounded to the nearest 0.1 ms, a
    // start just past the marker left it out: 12,000 bytes, seen in CI).
    let down = |t: f64| (t * 1e6).floor() / 1e6;
    let hash = format!("#range={:.6},{:.6}", down(at("two")), at("three") - 0.01);
    let (picked, log) = dom(&page, &hash, &profile).unwrap();
    assert!(!log.contains("CONSOLE"), "{log}");
    assert_eq!(attr(&picked, "status", "data-ok").as_deref(), Some("1"), "{picked}");
    assert_eq!(attr(&picked, "range", "hidden"), None, "{picked}");
    assert_eq!(rows(&picked, "range-table"), vec![("phase_two".to_owned(), 15_000)], "{hash}");
    // All three phases, by marker name: the three leaks and no buffer.
    let (all, _) = dom(&page, "#range=one,end", &profile).unwrap();
    let mut got = rows(&all, "range-table");
    got.sort();
    assert_eq!(got, vec![("phase_one".into(), 10_000), ("phase_three".into(), 7_000), ("phase_two".into(), 15_000)]);

    // A screenshot, kept as the test run's artifact.
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("html-report.png");
    let _ = std::fs::remove_file(&shot);
    let out = chromium(&profile)
        .unwrap()
        .args(["--window-size=1280,2400"])
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}{hash}", page.display()))
        .output()
        .unwrap();
    assert!(out.status.success() && std::fs::metadata(&shot).is_ok_and(|m| m.len() > 10_000), "{out:?}");
}

/// `mtrace run --html` of `prog` into `dir/name.html`, and its DOM in chromium.
fn page_of(dir: &Path, name: &str, prog: &[&str], profile: &Path) -> Option<String> {
    let page = dir.join(format!("{name}.html"));
    let out = Command::new(mtrace())
        .args(["run", "-o", "/dev/null", "--html"])
        .arg(&page)
        .arg("--")
        .args(prog)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (d, log) = dom(&page, "", profile)?;
    assert!(!log.contains("CONSOLE"), "{log}");
    assert_eq!(attr(&d, "status", "data-ok").as_deref(), Some("1"), "{d}");
    Some(d)
}

#[test]
fn a_short_run_and_one_without_leaks_read_right() {
    // What a person saw on the page (issue 42, item 12).
    let dir = scratch("html-short");
    let profile = dir.join("chromium");
    let prog = build("scan.c", &dir.join("scan"), &["-g", "-O0"]);
    let Some(d) = page_of(&dir, "short", &[prog.to_str().unwrap(), "a b", ""], &profile) else {
        cannot_run("chromium is not installed");
        return;
    };
    // The time axis of a run of a few ms: distinct labels in ms, rising,
    // the first at the axis's start.
    let labels: Vec<(f64, String)> = d
        .split("<text ")
        .skip(1)
        .filter(|t| t.contains("y=\"254\""))
        .map(|t| {
            let x: f64 = t.split("x=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
            (x, t.split('>').nth(1).unwrap().split('<').next().unwrap().to_owned())
        })
        .collect();
    assert!(labels.len() >= 3 && labels.iter().all(|(_, l)| l.ends_with(" ms")), "{labels:?}");
    assert!(labels.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 != w[1].1), "{labels:?}");
    assert_eq!(labels[0].1.trim_end_matches(" ms").parse::<f64>().unwrap(), 0.0, "{labels:?}");
    // The live heap runs to the end of the axis (x = 1000 - 8), at what
    // was not freed (9 blocks: a line above 0 bytes is not asked).
    let heap = d.split("<polyline class=\"heap\" points=\"").nth(1).unwrap().split('"').next().unwrap();
    assert!(heap.split(' ').next_back().unwrap().starts_with("992.0,"), "{heap}");
    // Words as the text report's: "1 block", the exit status, the command
    // quoted, a table header over the size bars, the page's own note.
    assert!(d.contains("112 bytes in 1 block<") && !d.contains(" 1 blocks"), "{d}");
    assert!(d.contains(">exit, status 0<"), "{d}");
    assert!(d.contains(&format!(">{} 'a b' ''<", prog.display())), "{d}");
    assert!(d.contains(">calls, against the most</th>"), "{d}");
    assert!(d.contains(">Page drawn in ") && !d.contains(">drawn<"), "{d}");
    // No temporary allocation: said, not an empty table.
    let temp = d.split("id=\"temporary\"").nth(1).unwrap().split("</section>").next().unwrap();
    assert!(temp.contains(">None.<") && !temp.contains("<table"), "{temp}");
    // A program that leaves nothing: a sentence, not "Leaks (0)" over an empty table.
    let d = page_of(&dir, "none", &["/bin/true"], &profile).unwrap();
    assert!(d.contains("id=\"no-leaks\"") && !d.contains("id=\"leak-table\""), "{d}");
    // A program without line info (as redis-server is packaged): each row
    // names the program's own function, not glibc's start, which has a
    // line (issue 65, item 4).
    let bare = build("families.c", &dir.join("families"), &["-O0"]);
    let d = page_of(&dir, "bare", &[bare.to_str().unwrap()], &profile).unwrap();
    let named: Vec<String> = rows(&d, "leak-table").into_iter().map(|(f, _)| f).collect();
    assert_eq!(named.len(), 9, "{d}");
    assert!(named.iter().all(|f| f.starts_with("leak_") || f == "main"), "{named:?}");
}
