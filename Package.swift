// swift-tools-version:6.1
import PackageDescription

let package = Package(
    name: "swift-upload",
    products: [
        .library(name: "UploadProtocol", targets: ["UploadProtocol"]),
        .library(name: "UploadChecksums", targets: ["UploadChecksums"]),
        .library(name: "UploadPayload", targets: ["UploadPayload"]),
        .library(name: "UploadAgent", targets: ["UploadAgent"]),
        .library(name: "UploadRelay", targets: ["UploadRelay"]),
        .library(name: "UploadRelayBackends", targets: ["UploadRelayBackends"]),
        .library(name: "UploadS3", targets: ["UploadS3"]),
        // For the fuzz harness (tools/fuzz): the relay's session run without sockets.
        .library(name: "UploadTestSupport", targets: ["UploadTestSupport"]),
        .executable(name: "upload-agent", targets: ["upload-agent"]),
        .executable(name: "upload-relay", targets: ["upload-relay"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/groue/GRDB.swift.git", from: "7.10.0"),
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
    ],
    targets: [
        // Pure wire protocol: frames, codec, limits, error codes, state machines. No I/O.
        .target(
            name: "UploadProtocol",
            dependencies: [.product(name: "NIOCore", package: "swift-nio")]
        ),
        // System libraries, reached through tiny module maps.
        // CRC-32 and zlib streams: zlib (the design's system package), or libdeflate loaded at run time when installed
        // (CRC-32 with the CPU's carry-less multiply, zlib streams made faster; docs/benchmarks.md).
        .target(name: "CUploadDeflate", linkerSettings: [.linkedLibrary("z")]),
        .systemLibrary(name: "CUploadCrypto", pkgConfig: "libcrypto", providers: [.apt(["libssl-dev"])]),
        // The agent's state database, on SQLite's C API (no binding library: GRDB brings Foundation and ICU's data).
        .systemLibrary(name: "CUploadSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        // What Swift's Glibc module leaves out (O_DIRECT).
        .target(name: "CUploadSystem"),
        // Commands run apart from the agent and the relay (hooks, --when): own session, clean signals, bounded output.
        .target(
            name: "UploadPlatform", dependencies: ["CUploadSystem", "UploadProtocol", .product(name: "Logging", package: "swift-log")]
        ),
        // The relay's --dev CA and server certificate, made with the system's libcrypto (OpenSSL 3).
        .target(name: "CUploadCertificates", linkerSettings: [.linkedLibrary("crypto")]),
        // SHA-1 (libcrypto, exportable state), CRC32 and deflate (zlib or libdeflate).
        .target(
            name: "UploadChecksums",
            dependencies: ["CUploadDeflate", "CUploadCrypto"]
        ),
        // A CHUNK's payload (CRC-32, deflate), sealed by the agent and opened by the relay: one type below both roles.
        .target(
            name: "UploadPayload",
            dependencies: ["UploadProtocol", "UploadChecksums", .product(name: "NIOCore", package: "swift-nio")]
        ),
        .target(
            name: "UploadAgent",
            dependencies: [
                "UploadProtocol", "UploadChecksums", "UploadPayload", "UploadPlatform",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                "CUploadSQLite",
            ],
            exclude: ["README.md"]
        ),
        // The relay's core: sessions, policy, server, status, hooks, metrics; catalogs and stores behind the `Catalog`
        // and `BlobStore` protocols, implemented in targets of their own (below), put together by UploadRelayBackends.
        .target(
            name: "UploadRelay",
            dependencies: [
                "UploadProtocol", "UploadChecksums", "UploadPayload", "CUploadSystem", "UploadPlatform",
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                "CUploadCertificates",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            exclude: ["README.md"]
        ),
        // The relay's SQLite catalog (one relay), on GRDB.
        .target(
            name: "UploadRelaySQLite",
            dependencies: [
                "UploadRelay", "UploadProtocol",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The catalog several relays share, on PostgresNIO, with its key locks across relays.
        .target(
            name: "UploadRelayPostgres",
            dependencies: [
                "UploadRelay", "UploadProtocol", "UploadChecksums",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // Objects in a local directory, staged in files beside it.
        .target(
            name: "UploadRelayLocalStore",
            dependencies: [
                "UploadRelay", "UploadProtocol", "UploadChecksums", "CUploadSystem",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // Objects in an S3-compatible bucket, staged as multipart uploads.
        .target(
            name: "UploadRelayS3Store",
            dependencies: [
                "UploadRelay", "UploadProtocol", "UploadChecksums", "UploadS3",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The one place that knows every backend: the catalog and the store a configuration names.
        .target(
            name: "UploadRelayBackends",
            dependencies: [
                "UploadRelay", "UploadRelaySQLite", "UploadRelayPostgres", "UploadRelayLocalStore", "UploadRelayS3Store", "UploadS3",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // An S3 client of our own (no Swift package signs S3 requests here): SigV4 on libcrypto's HMAC-SHA256, the
        // requests the relay's S3 store makes, over async-http-client.
        .target(
            name: "UploadS3",
            dependencies: [
                "UploadChecksums",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // Values both command-line programs parse (byte counts, durations, host:port).
        .target(
            name: "UploadCommandLine",
            dependencies: ["UploadProtocol", "CUploadSystem", .product(name: "ArgumentParser", package: "swift-argument-parser")]
        ),
        .executableTarget(
            name: "upload-agent",
            dependencies: [
                "UploadAgent", "UploadCommandLine", "CUploadSystem", "UploadProtocol", "UploadPlatform",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .executableTarget(
            name: "upload-relay",
            dependencies: [
                "UploadRelay", "UploadRelayBackends", "UploadRelaySQLite", "UploadRelayPostgres", "UploadRelayLocalStore", "UploadRelayS3Store",
                "UploadCommandLine", "UploadS3", "CUploadSystem", "UploadPlatform", "UploadProtocol",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        // The Swift API at work (Examples/README.md): several files uploaded as one object through a BlobSource.
        .executableTarget(
            name: "upload-joined",
            dependencies: ["UploadAgent", .product(name: "NIOCore", package: "swift-nio")],
            path: "Examples/JoinedUpload"
        ),
        .executableTarget(
            name: "codec-benchmark",
            dependencies: [
                "UploadProtocol", "UploadChecksums",
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            path: "tools/codec-benchmark"
        ),
        // The relay's seams in memory (catalog, store, key locks), with the answers of the real ones: for tests and
        // tools, never shipped in a binary.
        .target(
            name: "UploadRelayTesting",
            dependencies: [
                "UploadRelay", "UploadProtocol", "UploadChecksums",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ]
        ),
        // What the test targets and the fuzz harness share: the seeded generator, temporary directories, and the pump
        // that drives the relay's real session (catalog, store, pipeline) against the agent's state machine.
        .target(
            name: "UploadTestSupport",
            dependencies: [
                "UploadRelay", "UploadRelayBackends", "UploadRelaySQLite", "UploadRelayPostgres", "UploadRelayLocalStore", "UploadRelayS3Store",
                "UploadProtocol", "UploadPayload", "UploadChecksums", "UploadS3",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Tests/UploadTestSupport"
        ),
        .testTarget(
            name: "UploadProtocolTests",
            dependencies: [
                "UploadProtocol", "UploadChecksums", "UploadPayload", "UploadTestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
            ]
        ),
        .testTarget(
            name: "EndToEndTests",
            dependencies: [
                "UploadTestSupport", "UploadAgent", "UploadRelay", "UploadRelayBackends", "UploadRelaySQLite", "UploadRelayPostgres",
                "UploadRelayLocalStore", "UploadRelayS3Store", "UploadProtocol", "UploadChecksums", "CUploadSystem", "UploadS3",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "UploadChecksumsTests",
            dependencies: ["UploadChecksums", "UploadTestSupport"]
        ),
        .testTarget(
            name: "UploadAgentTests",
            dependencies: [
                "UploadAgent", "UploadProtocol", "UploadChecksums", "UploadTestSupport", "UploadCommandLine", "UploadRelay",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "UploadS3Tests",
            dependencies: [
                "UploadS3", "UploadChecksums", "UploadTestSupport",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            exclude: ["Fixtures"]
        ),
        .testTarget(
            name: "UploadRelayTests",
            dependencies: [
                "UploadRelay", "UploadRelayTesting", "UploadRelayBackends", "UploadRelaySQLite", "UploadRelayPostgres", "UploadRelayLocalStore",
                "UploadRelayS3Store", "UploadProtocol", "UploadChecksums", "UploadPayload", "UploadTestSupport", "CUploadSystem", "UploadS3",
                "UploadPlatform",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)

// Every Swift target of ours: `any` spelled out for existentials, and a module's members visible only where it is
// imported.
for target in package.targets where target.type != .system && target.type != .binary && target.type != .plugin {
    target.swiftSettings =
        (target.swiftSettings ?? []) + [
            .enableUpcomingFeature("ExistentialAny"), .enableUpcomingFeature("MemberImportVisibility"),
        ]
}
