//! Build steps:
//! 1. Compiles `proto/amble/v1/amble.proto` and the node-to-node
//!    `proto/amble/cluster/v1/cluster.proto` with protox (pure Rust, so a
//!    fresh machine needs no system `protoc`) and prost-build into
//!    `OUT_DIR`. The generated types also derive `serde::Serialize`
//!    (camelCase, the oneof flattened) so the shared test vectors in
//!    `web/test/vectors.json` can show each message as JSON beside its bytes.
//! 2. Lists the browser client's files under `web/` (not `web/test` or
//!    `node_modules`; the rule is in `src/edge/web/files.rs`) for `src/edge/web.rs`
//!    to embed, and has cargo watch those files only.

use std::path::{Path, PathBuf};

#[path = "src/edge/web/files.rs"]
mod files;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/amble/v1/amble.proto",
        "proto/amble/cluster/v1/cluster.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    prost_build::Config::new()
        .type_attribute(".", "#[derive(serde::Serialize)]")
        .type_attribute(".", "#[serde(rename_all = \"camelCase\")]")
        .field_attribute("amble.v1.ClientMessage.body", "#[serde(flatten)]")
        .field_attribute("amble.v1.ServerMessage.body", "#[serde(flatten)]")
        .compile_fds(descriptors)?;

    // Cargo watches only the client's own files (and the subdirectories
    // that hold them, so a file added there is seen). Not `web/` itself:
    // cargo scans a watched directory whole, and `web/test` changes without
    // touching the client. A file added at the top of `web/` is seen when
    // any client file changes, or by the test in src/edge/web.rs that compares
    // the embedded list with the directory.
    let web = Path::new(env!("CARGO_MANIFEST_DIR")).join("web");
    let listing = files::list(&web)?;
    for dir in &listing.dirs {
        println!("cargo:rerun-if-changed={}", dir.display());
    }
    let mut table = String::from("&[\n");
    for (rel, abs) in &listing.files {
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
