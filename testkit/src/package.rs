//! The SDK as an app installs it (issue #19): `web/` packed with `npm pack`
//! (Debian's npm, offline: packing reads only `web/`) and unpacked into
//! `node_modules/@amble/client` of a directory of the test's, as
//! `npm install` of the tarball would lay it out. The Node test imports it
//! by name from there, the browser test serves its files from an app's
//! own origin.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The package's name (web/package.json).
pub const NAME: &str = "@amble/client";

/// The packed package, unpacked.
pub struct Installed {
    /// `<dir>/node_modules/@amble/client`.
    pub root: PathBuf,
    /// The tarball's files, relative to the package (`amble.js`, `dist/…`), sorted.
    pub files: Vec<String>,
}

/// The repository's `web/`.
pub fn web_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../web")
}

/// Packs `web/` into `dir` and unpacks it into `dir/node_modules/@amble/client`.
/// Panics saying what to install when npm or tar is missing, or with their
/// output when they fail.
pub fn install(dir: &Path) -> Installed {
    let out = Command::new("npm")
        .args(["pack", "--offline", "--silent", "--pack-destination"])
        .arg(dir)
        .current_dir(web_dir())
        .output()
        .unwrap_or_else(|err| {
            panic!("npm ({err}): scripts/test installs Debian's npm; run `apt-get install npm`")
        });
    assert!(
        out.status.success(),
        "npm pack failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let name = String::from_utf8_lossy(&out.stdout)
        .lines()
        .rev()
        .find(|l| l.ends_with(".tgz"))
        .unwrap_or_else(|| panic!("npm pack named no tarball: {out:?}"))
        .trim()
        .to_owned();
    let tarball = dir.join(name);
    let root = dir.join("node_modules").join(NAME);
    std::fs::create_dir_all(&root).expect("mkdir node_modules/@amble/client");
    let tar = |args: &[&std::ffi::OsStr]| {
        let out = Command::new("tar")
            .args(args)
            .output()
            .expect("tar: `apt-get install tar`");
        assert!(out.status.success(), "tar {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mut files: Vec<String> = tar(&["tzf".as_ref(), tarball.as_os_str()])
        .lines()
        .map(|l| l.strip_prefix("package/").unwrap_or(l).to_owned())
        .collect();
    files.sort();
    tar(&[
        "xzf".as_ref(),
        tarball.as_os_str(),
        "-C".as_ref(),
        root.as_os_str(),
        "--strip-components=1".as_ref(),
    ]);
    Installed { root, files }
}
