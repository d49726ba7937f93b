//! Build steps:
//! 1. Compiles `proto/amble/v1/amble.proto` with protox (pure Rust, so a
//!    fresh machine needs no system `protoc`) and prost-build into
//!    `OUT_DIR`. The generated types also derive `serde::Serialize`
//!    (camelCase, the oneof flattened) so the shared test vectors in
//!    `web/test/vectors.json` can show each message as JSON beside its bytes.
//! 2. Lists the browser client's files under `web/` (not `web/test` or
//!    `node_modules`) for `src/web.rs` to embed.

use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/amble/v1/amble.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    prost_build::Config::new()
        .type_attribute(".", "#[derive(serde::Serialize)]")
        .type_attribute(".", "#[serde(rename_all = \"camelCase\")]")
        .field_attribute("amble.v1.ClientMessage.body", "#[serde(flatten)]")
        .field_attribute("amble.v1.ServerMessage.body", "#[serde(flatten)]")
        .compile_fds(descriptors)?;

    let web = Path::new(env!("CARGO_MANIFEST_DIR")).join("web");
    println!("cargo:rerun-if-changed=web");
    let mut files = Vec::new();
    if web.is_dir() {
        collect(&web, &web, &mut files)?;
    }
    files.sort();
    let mut table = String::from("&[\n");
    for (rel, abs) in &files {
        println!("cargo:rerun-if-changed={}", abs.display());
        table.push_str(&format!(
            "    ({rel:?}, include_bytes!({:?})),\n",
            abs.display().to_string()
        ));
    }
    table.push_str("]\n");
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("web_assets.rs");
    std::fs::write(out, table)?;
    Ok(())
}

fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, PathBuf)>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        if path.is_dir() {
            if name != "test" && name != "node_modules" {
                println!("cargo:rerun-if-changed={}", path.display());
                collect(root, &path, files)?;
            }
        } else if !matches!(name.as_str(), "package.json" | "package-lock.json") {
            let rel = path
                .strip_prefix(root)
                .map_err(std::io::Error::other)?
                .to_string_lossy()
                .replace('\\', "/");
            files.push((rel, path));
        }
    }
    Ok(())
}
