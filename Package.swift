// swift-tools-version:6.1
import PackageDescription

let package = Package(
    name: "swift-upload",
    platforms: [.macOS(.v14)],
    products: [
        .library(name: "UploadProtocol", targets: ["UploadProtocol"]),
        .library(name: "UploadChecksums", targets: ["UploadChecksums"]),
        .library(name: "UploadAgent", targets: ["UploadAgent"]),
        .library(name: "UploadRelay", targets: ["UploadRelay"]),
        .executable(name: "upload-agent", targets: ["upload-agent"]),
        .executable(name: "upload-relay", targets: ["upload-relay"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
    ],
    targets: [
        // Pure wire protocol: frames, codec, limits, error codes, state machines. No I/O.
        .target(
            name: "UploadProtocol",
            dependencies: [.product(name: "NIOCore", package: "swift-nio")]
        ),
        // System libraries, reached through tiny module maps.
        .systemLibrary(name: "CUploadZlib", pkgConfig: "zlib", providers: [.apt(["zlib1g-dev"])]),
        .systemLibrary(name: "CUploadCrypto", pkgConfig: "libcrypto", providers: [.apt(["libssl-dev"])]),
        // SHA-1 (libcrypto, exportable state), CRC32 and deflate (zlib).
        .target(
            name: "UploadChecksums",
            dependencies: ["CUploadZlib", "CUploadCrypto"]
        ),
        .target(
            name: "UploadAgent",
            dependencies: [
                "UploadProtocol", "UploadChecksums",
                .product(name: "NIOCore", package: "swift-nio"),
            ]
        ),
        .target(
            name: "UploadRelay",
            dependencies: [
                "UploadProtocol", "UploadChecksums",
                .product(name: "NIOCore", package: "swift-nio"),
            ]
        ),
        .executableTarget(
            name: "upload-agent",
            dependencies: [
                "UploadAgent",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .executableTarget(
            name: "upload-relay",
            dependencies: [
                "UploadRelay",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .executableTarget(
            name: "codec-benchmark",
            dependencies: [
                "UploadProtocol", "UploadChecksums",
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            path: "tools/codec-benchmark"
        ),
        .testTarget(
            name: "UploadProtocolTests",
            dependencies: [
                "UploadProtocol", "UploadChecksums", "UploadRelay",
                .product(name: "NIOCore", package: "swift-nio"),
            ]
        ),
        .testTarget(
            name: "UploadChecksumsTests",
            dependencies: ["UploadChecksums"]
        ),
    ],
    swiftLanguageModes: [.v6]
)
