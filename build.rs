//! Compiles `proto/amble/v1/amble.proto` with protox (pure Rust, so a fresh
//! machine needs no system `protoc`) and prost-build into `OUT_DIR`.
//!
//! The generated types also derive `serde::Serialize` (camelCase, the oneof
//! flattened) so the shared test vectors in `web/test/vectors.json` can show
//! each message as JSON next to its bytes.

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
    Ok(())
}
