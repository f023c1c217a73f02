// swift-tools-version:6.1
// A libFuzzer harness for what a hostile agent controls: the bytes the relay's real session decodes
// and answers (UploadTestSupport's RelayDriver). Its own package, because it builds with -sanitize=fuzzer;
// see README.md here.
import PackageDescription

let package = Package(
    name: "upload-fuzz",
    dependencies: [
        .package(name: "swift-upload", path: "../..")
    ],
    targets: [
        .executableTarget(
            name: "FuzzRelayInput",
            dependencies: [
                .product(name: "UploadProtocol", package: "swift-upload"),
                .product(name: "UploadTestSupport", package: "swift-upload"),
            ]
        )
    ],
    swiftLanguageModes: [.v6]
)
