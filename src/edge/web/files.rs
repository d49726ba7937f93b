//! Which files under `web/` are the browser client, embedded by the server:
//! the SDK's modules, its versioned bundle (`dist/amble-<version>.js`) and
//! the demo app; not the tests, the build script or the package's README
//! and TypeScript declarations.
//! Shared by build.rs, which embeds them and tells cargo to watch them, and
//! by a test in `web.rs`, which checks that the build saw every one.

use std::path::{Path, PathBuf};

/// Directories under `web/` that hold no part of the client (`scripts`:
/// the bundle's build script).
const SKIP_DIRS: &[&str] = &["test", "node_modules", "scripts"];
/// Files under `web/` that are not served: the package's own files.
const SKIP_FILES: &[&str] = &[
    "package.json",
    "package-lock.json",
    "README.md",
    "LICENSE-MIT",
    "LICENSE-APACHE",
];
/// Endings of files under `web/` that are not served: TypeScript
/// declarations, for the package only, and a tarball `npm pack` left.
const SKIP_ENDINGS: &[&str] = &[".d.ts", ".tgz"];

/// The client's files, and the directories below `web/` that hold them.
pub struct Listing {
    /// (path relative to `web/` with `/` separators, absolute path), sorted.
    pub files: Vec<(String, PathBuf)>,
    /// Subdirectories of `web/` (not `web/` itself) that hold client files.
    pub dirs: Vec<PathBuf>,
}

/// Lists the client under `root` (the `web/` directory). Names starting
/// with a dot are skipped.
pub fn list(root: &Path) -> std::io::Result<Listing> {
    let mut listing = Listing {
        files: Vec::new(),
        dirs: Vec::new(),
    };
    if root.is_dir() {
        collect(root, root, &mut listing)?;
    }
    listing.files.sort();
    listing.dirs.sort();
    Ok(listing)
}

fn collect(root: &Path, dir: &Path, listing: &mut Listing) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        if path.is_dir() {
            if !SKIP_DIRS.contains(&name.as_str()) {
                listing.dirs.push(path.clone());
                collect(root, &path, listing)?;
            }
        } else if !SKIP_FILES.contains(&name.as_str())
            && !SKIP_ENDINGS.iter().any(|end| name.ends_with(end))
        {
            let rel = path
                .strip_prefix(root)
                .map_err(std::io::Error::other)?
                .to_string_lossy()
                .replace('\\', "/");
            listing.files.push((rel, path));
        }
    }
    Ok(())
}
