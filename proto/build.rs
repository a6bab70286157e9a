//! Generates the tonic/prost code from `quantfarm/v1/*.proto` with a vendored `protoc`, so that a fresh machine
//! needs nothing installed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // prost-build finds protoc through this variable; a build script is single-threaded.
    std::env::set_var("PROTOC", protoc);
    tonic_prost_build::configure().compile_protos(&["quantfarm/v1/farm.proto"], &["."])?;
    println!("cargo:rerun-if-changed=quantfarm/v1/farm.proto");
    Ok(())
}
