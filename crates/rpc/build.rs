//! Generates the cluster protocol's messages and gRPC client and server from
//! `proto/cluster.proto` with tonic's prost code generator (needs `protoc`: Debian's
//! `protobuf-compiler`, or the `PROTOC` environment variable naming one).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/cluster.proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // ChildSa carries keys: its `Debug` (in the crate) redacts them.
        .skip_debug([".protego.cluster.v1.ChildSa"])
        .compile_protos(&["proto/cluster.proto"], &["proto"])?;
    Ok(())
}
