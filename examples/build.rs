//! Compiles `proto/greeter.proto` for the `tonic_client` example.
//!
//! protox parses the `.proto` files in Rust and hands tonic-prost-build a
//! `FileDescriptorSet`, so building the examples needs no `protoc` install.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["greeter.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
