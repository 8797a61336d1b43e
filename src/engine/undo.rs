//! Whether one commit's change undoes another's, read from their unified diffs (each against
//! its first parent, as Forgejo serves them). A message saying "This reverts commit <sha>"
//! is anyone's to write; the change is not. Per file, the diff is reduced to each line's net
//! count (added minus removed): the reduction does not depend on which of several equally
//! short diffs a forge printed, and a revert's is the merge's negated even after later
//! commits changed other lines of the file.

use std::collections::BTreeMap;

/// A commit's change: per file (its paths, a rename's both), each line's net count.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Change {
    files: BTreeMap<String, BTreeMap<String, i64>>,
}

/// A hunk's lines still to read: the old side's and the new side's.
#[derive(Clone, Copy)]
struct Hunk {
    old: u64,
    new: u64,
}

impl Change {
    /// Reads a unified diff (git's: `diff --git` sections). What is not understood is left
    /// out, so a diff read wrong can only make a revert fail to be confirmed.
    pub fn parse(diff: &str) -> Self {
        let mut files = BTreeMap::new();
        let mut section: Option<Section> = None;
        let mut hunk: Option<Hunk> = None;
        for line in diff.lines() {
            if let Some(h) = hunk.as_mut().filter(|h| h.old > 0 || h.new > 0) {
                let Some(s) = section.as_mut() else { break };
                let (sign, text) = line.split_at(line.len().min(1));
                match sign {
                    "+" => {
                        h.new = h.new.saturating_sub(1);
                        *s.net.entry(text.to_owned()).or_default() += 1;
                    }
                    "-" => {
                        h.old = h.old.saturating_sub(1);
                        *s.net.entry(text.to_owned()).or_default() -= 1;
                    }
                    "\\" => {}
                    _ => {
                        h.old = h.old.saturating_sub(1);
                        h.new = h.new.saturating_sub(1);
                    }
                }
                continue;
            }
            hunk = None;
            if let Some(rest) = line.strip_prefix("diff --git ") {
                if let Some(done) = section.take() {
                    done.finish(&mut files);
                }
                section = Some(Section::new(rest));
            } else if let Some(s) = section.as_mut() {
                if let Some(h) = line.strip_prefix("@@ ") {
                    hunk = Some(hunk_counts(h));
                } else if let Some(p) = line.strip_prefix("--- ") {
                    s.path(p, "a/");
                } else if let Some(p) = line.strip_prefix("+++ ") {
                    s.path(p, "b/");
                } else if let Some(p) = line
                    .strip_prefix("rename from ")
                    .or_else(|| line.strip_prefix("rename to "))
                {
                    s.path(p, "");
                }
            }
        }
        if let Some(done) = section.take() {
            done.finish(&mut files);
        }
        Self { files }
    }

    /// Whether this change undoes `merged`: it touches every file `merged` touched, and per
    /// file its net line counts are `merged`'s negated. A merge that changed no file is
    /// undone by nothing (anything would "undo" it).
    pub fn undoes(&self, merged: &Change) -> bool {
        !merged.files.is_empty()
            && merged.files.iter().all(|(file, net)| {
                self.files.get(file).is_some_and(|mine| {
                    mine.len() == net.len()
                        && net.iter().all(|(line, n)| mine.get(line) == Some(&-n))
                })
            })
    }
}

/// One file's part of a diff as it is read.
struct Section {
    /// The `diff --git` line's rest, the file's name when no `---`/`+++` line names it
    /// (a mode change, a binary file).
    header: String,
    paths: Vec<String>,
    net: BTreeMap<String, i64>,
}

impl Section {
    fn new(header: &str) -> Self {
        Self {
            header: header.to_owned(),
            paths: Vec::new(),
            net: BTreeMap::new(),
        }
    }

    fn path(&mut self, p: &str, prefix: &str) {
        let p = p.trim_end_matches('\t');
        if p != "/dev/null" {
            let p = p.strip_prefix(prefix).unwrap_or(p);
            if !self.paths.iter().any(|q| q == p) {
                self.paths.push(p.to_owned());
            }
        }
    }

    fn finish(mut self, files: &mut BTreeMap<String, BTreeMap<String, i64>>) {
        self.net.retain(|_, n| *n != 0);
        self.paths.sort();
        let key = if self.paths.is_empty() {
            self.header
        } else {
            self.paths.join("\n")
        };
        let net = files.entry(key).or_default();
        for (line, n) in self.net {
            *net.entry(line).or_default() += n;
        }
        net.retain(|_, n| *n != 0);
    }
}

/// `-a,b +c,d @@ ...`: how many old and new lines the hunk holds (a missing count is 1).
fn hunk_counts(h: &str) -> Hunk {
    let count = |side: Option<&str>, sign: char| {
        side.and_then(|s| s.strip_prefix(sign))
            .and_then(|s| s.split_once(',').map_or(Some(1), |(_, n)| n.parse().ok()))
            .unwrap_or(0)
    };
    let mut parts = h.split_whitespace();
    let old = count(parts.next(), '-');
    let new = count(parts.next(), '+');
    Hunk { old, new }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MERGE: &str = "diff --git a/src/cli.rs b/src/cli.rs\nindex 1..2 100644\n--- a/src/cli.rs\n+++ b/src/cli.rs\n@@ -1,3 +1,4 @@\n fn main() {\n-    run();\n+    let verbose = true;\n+    run(verbose);\n }\ndiff --git a/NOTES b/NOTES\nnew file mode 100644\n--- /dev/null\n+++ b/NOTES\n@@ -0,0 +1 @@\n+--- a note\n";

    const REVERT: &str = "diff --git a/NOTES b/NOTES\ndeleted file mode 100644\n--- a/NOTES\n+++ /dev/null\n@@ -1 +0,0 @@\n---- a note\ndiff --git a/src/cli.rs b/src/cli.rs\n--- a/src/cli.rs\n+++ b/src/cli.rs\n@@ -10,4 +10,3 @@ fn x()\n fn main() {\n+    run();\n-    let verbose = true;\n-    run(verbose);\n }\n";

    #[test]
    fn a_revert_undoes_the_merge_and_nothing_else_does() {
        let merged = Change::parse(MERGE);
        assert_eq!(merged.files.len(), 2, "{merged:?}");
        assert!(Change::parse(REVERT).undoes(&merged));
        // The same message with another change: one line left, a file not touched.
        let partly = REVERT
            .replace("+    run();\n", "")
            .replace("@@ -10,4 +10,3", "@@ -10,4 +10,2");
        assert!(!Change::parse(&partly).undoes(&merged));
        let one_file = REVERT.split("diff --git a/src").next().unwrap_or_default();
        assert!(!Change::parse(one_file).undoes(&merged));
        assert!(!Change::parse("").undoes(&merged));
        // The merge again is not its undoing; nothing undoes an empty change.
        assert!(!merged.undoes(&merged));
        assert!(!merged.undoes(&Change::parse("")));
    }

    #[test]
    fn a_file_changed_to_something_else_is_not_undone() {
        let merged = Change::parse(
            "diff --git a/a b/a\nnew file mode 100644\n--- /dev/null\n+++ b/a\n@@ -0,0 +1 @@\n+fixed\n",
        );
        let other =
            Change::parse("diff --git a/a b/a\n--- a/a\n+++ b/a\n@@ -1 +1 @@\n-fixed\n+other\n");
        assert!(!other.undoes(&merged));
        let deleted = Change::parse(
            "diff --git a/a b/a\ndeleted file mode 100644\n--- a/a\n+++ /dev/null\n@@ -1 +0,0 @@\n-fixed\n",
        );
        assert!(deleted.undoes(&merged));
    }

    #[test]
    fn hunk_counts_read_a_missing_count_as_one() {
        let h = hunk_counts("-0,0 +1 @@");
        assert_eq!((h.old, h.new), (0, 1));
        let h = hunk_counts("-3,7 +3,9 @@ fn x()");
        assert_eq!((h.old, h.new), (7, 9));
    }
}
