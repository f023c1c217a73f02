import Foundation
import Logging
import Testing
import UploadS3
import UploadTestSupport

@testable import UploadRelay
@testable import UploadRelayS3Store
@testable import UploadRelaySQLite
import AsyncHTTPClient

/// Multipart uploads a relay began and never recorded (killed between the two), and other writers' uploads in the same
/// bucket: against the run's real SeaweedFS.
@Suite("S3 orphans (SeaweedFS)")
struct S3OrphanTests {
    /// Begins a multipart upload of `objectKey` as the relay does: recorded in the ledger first (its upload id too, unless
    /// the relay "died" before it heard it).
    static func begin(
        _ objectKey: String, account: String, key: String, ledger: any MultipartLedger, client: S3Client, bucket: String, recordID: Bool = true
    ) async throws -> String {
        let intent = try await ledger.recordMultipartIntent(account: account, key: key, objectKey: objectKey)
        let id = try await client.createMultipartUpload(bucket: bucket, key: objectKey)
        if recordID { try await ledger.recordMultipartUpload(intent: intent, uploadID: id) }
        return id
    }

    /// A bucket of its own, a catalog with account cam-7 as the store's ledger, and the store on them with `prefix`.
    static func withStore(
        prefix: String, _ body: (S3Client, String, SQLiteCatalog, S3Store) async throws -> Void
    ) async throws {
        let server = try S3TestServer()
        try await S3TestServer.withBucket { client, bucket in
            let root = TemporaryDirectories.make(prefix: "upload-s3-orphans-")
            let catalog = try SQLiteCatalog(path: root + "/catalog.sqlite")
            try await catalog.addAccount(name: "cam-7", tokenHash: [1], quota: nil)
            let store = try S3Store(
                client: S3Client(endpoint: server.endpoint, credentials: server.credentials, http: .shared), bucket: bucket,
                prefix: prefix, spoolDirectory: root + "/spool", ledger: catalog
            )
            try await body(client, bucket, catalog, store)
        }
    }

    static var quiet: Logger {
        var logger = Logger(label: "test-orphans")
        logger.logLevel = .critical
        return logger
    }

    @Test(
        "cleanup aborts the multipart uploads the relays began and no session names, once no upload holds their key; never another writer's, even of a key that reads as an account's"
    )
    func orphans() async throws {
        try await Self.withStore(prefix: "relay") { client, bucket, catalog, store in
            for key in ["orphan.mov", "held.mov", "recorded.mov"] {
                _ = try await Self.begin("relay/cam-7/" + key, account: "cam-7", key: key, ledger: catalog, client: client, bucket: bucket)
            }
            // Killed after CreateMultipartUpload, before it recorded the id: found by its key and time.
            _ = try await Self.begin(
                "relay/cam-7/unheard.mov", account: "cam-7", key: "unheard.mov", ledger: catalog, client: client, bucket: bucket, recordID: false
            )
            // Another tool's uploads under the same prefix, one of a key that reads as the account's.
            _ = try await client.createMultipartUpload(bucket: bucket, key: "relay/cam-7/foreign.mov")
            _ = try await client.createMultipartUpload(bucket: bucket, key: "relay/not-a-key")
            let recordedID = try await #require(try catalog.multipartIntents().first { $0.key == "recorded.mov" }?.uploadID)
            let recorded = S3Store.name(uploadID: recordedID, key: "relay/cam-7/recorded.mov")
            try await catalog.putSession(
                UploadSession(
                    id: "s1", account: "cam-7", key: "recorded.mov", resumeToken: [1], fingerprint: [], declaredSize: nil,
                    durableOffset: 0, sha1State: [], stagingName: recorded
                )
            )
            #expect(store.stagingOwner(recorded)! == ("cam-7", "recorded.mov"))
            let claims = KeyClaims()
            let held = KeyClaims.name(account: "cam-7", key: "held.mov")
            #expect(claims.claim(held, whenFree: {}) == .claimed)
            // As the relay's maintenance runs it: sessions expire after an hour, nameless stagings after that too.
            try await RelayRuntime.cleanUp(
                catalog: catalog, store: store, expiry: .seconds(3600), logger: Self.quiet, keys: .claiming(claims),
                orphansBefore: Date().addingTimeInterval(-3600)
            )
            let left = Set(try await client.listMultipartUploads(bucket: bucket, prefix: "").map(\.key))
            #expect(left == ["relay/cam-7/held.mov", "relay/cam-7/recorded.mov", "relay/cam-7/foreign.mov", "relay/not-a-key"])
            // Once the key is let go, the next pass takes its orphan too; the other writer's stay, whatever their key.
            claims.release(held)
            try await RelayRuntime.cleanUp(
                catalog: catalog, store: store, expiry: .seconds(3600), logger: Self.quiet, keys: .claiming(claims),
                orphansBefore: Date().addingTimeInterval(-3600)
            )
            let after = Set(try await client.listMultipartUploads(bucket: bucket, prefix: "").map(\.key))
            #expect(after == ["relay/cam-7/recorded.mov", "relay/cam-7/foreign.mov", "relay/not-a-key"])
            // The ledger keeps what is still there (the recorded session's upload), and the intent whose id was never
            // heard until it is older than the grace (its upload may still be on its way); the others are forgotten.
            #expect(try await catalog.multipartIntents().map(\.key).sorted() == ["recorded.mov", "unheard.mov"])
        }
    }

    @Test("a store with no prefix (the whole bucket) leaves other writers' multipart uploads alone, at startup and after")
    func wholeBucket() async throws {
        try await Self.withStore(prefix: "") { client, bucket, catalog, store in
            let others = ["backups/2024/db.tar", "other-app/videos/big.mp4"]
            for key in others { _ = try await client.createMultipartUpload(bucket: bucket, key: key) }
            _ = try await Self.begin("cam-7/orphan.mov", account: "cam-7", key: "orphan.mov", ledger: catalog, client: client, bucket: bucket)
            // At startup (every staging an orphan whatever its age), then as maintenance.
            try await RelayRuntime.cleanUp(catalog: catalog, store: store, expiry: .seconds(3600), logger: Self.quiet)
            try await RelayRuntime.cleanUp(
                catalog: catalog, store: store, expiry: .seconds(3600), logger: Self.quiet, orphansBefore: Date().addingTimeInterval(-3600)
            )
            let left = Set(try await client.listMultipartUploads(bucket: bucket, prefix: "").map(\.key))
            #expect(left == Set(others))
        }
    }
}
