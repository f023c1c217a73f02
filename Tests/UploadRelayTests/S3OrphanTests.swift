import Foundation
import Logging
import Testing
import UploadS3
import UploadTestSupport

@testable import UploadRelay

/// Multipart uploads a relay made and never recorded (killed between the two): against the run's real SeaweedFS.
@Suite("S3 orphans (SeaweedFS)")
struct S3OrphanTests {
    @Test("cleanup aborts a multipart upload that no session names once no upload holds its key, however young; one whose key is held, one a session names, and one not of a key of ours stay")
    func orphans() async throws {
        let server = try S3TestServer()
        try await S3TestServer.withBucket { client, bucket in
            let root = TemporaryDirectories.make(prefix: "upload-s3-orphans-")
            let catalog = try SQLiteCatalog(path: root + "/catalog.sqlite")
            try catalog.addAccount(name: "cam-7", tokenHash: [1], quota: nil)
            let store = try S3Store(
                client: S3Client(endpoint: server.endpoint, credentials: server.credentials, http: .shared), bucket: bucket,
                prefix: "relay", spoolDirectory: root + "/spool"
            )
            var uploads: [String: String] = [:]
            for key in ["relay/cam-7/orphan.mov", "relay/cam-7/held.mov", "relay/cam-7/recorded.mov", "relay/not-a-key"] {
                uploads[key] = try await client.createMultipartUpload(bucket: bucket, key: key)
            }
            let recorded = S3Store.name(uploadID: try #require(uploads["relay/cam-7/recorded.mov"]), key: "relay/cam-7/recorded.mov")
            try catalog.putSession(
                UploadSession(
                    id: "s1", account: "cam-7", key: "recorded.mov", resumeToken: [1], fingerprint: [], declaredSize: nil,
                    durableOffset: 0, sha1State: [], stagingName: recorded
                )
            )
            #expect(store.stagingOwner(recorded)! == ("cam-7", "recorded.mov"))
            #expect(store.stagingOwner(S3Store.name(uploadID: "x", key: "relay/not-a-key")) == nil)
            let claims = KeyClaims()
            let held = KeyClaims.name(account: "cam-7", key: "held.mov")
            #expect(claims.claim(held, whenFree: {}) == .claimed)
            var logger = Logger(label: "test-orphans")
            logger.logLevel = .critical
            // As the relay's maintenance runs it: sessions expire after an hour, nameless stagings after that too.
            try RelayRuntime.cleanUp(
                catalog: catalog, store: store, expiry: .seconds(3600), logger: logger, keys: .claiming(claims),
                orphansBefore: Date().addingTimeInterval(-3600)
            )
            let left = Set(try await client.listMultipartUploads(bucket: bucket, prefix: "").map(\.key))
            #expect(left == ["relay/cam-7/held.mov", "relay/cam-7/recorded.mov", "relay/not-a-key"])
            // Once the key is let go, the next pass takes its orphan too.
            claims.release(held)
            try RelayRuntime.cleanUp(
                catalog: catalog, store: store, expiry: .seconds(3600), logger: logger, keys: .claiming(claims),
                orphansBefore: Date().addingTimeInterval(-3600)
            )
            let after = Set(try await client.listMultipartUploads(bucket: bucket, prefix: "").map(\.key))
            #expect(after == ["relay/cam-7/recorded.mov", "relay/not-a-key"])
        }
    }
}
