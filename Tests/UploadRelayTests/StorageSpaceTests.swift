import Foundation
import GRDB
import Logging
import NIOConcurrencyHelpers
import NIOPosix
import Testing
import UploadProtocol
@testable import UploadRelay
@testable import UploadRelayLocalStore
@testable import UploadRelaySQLite
import UploadTestSupport

/// An upload that cannot fit the relay's disk is refused at OPEN, before a byte is staged (SPEC §7); what agents are
/// told of storage failures names nothing of the relay's (SPEC §12.3).
@Suite("Relay: free space at OPEN, and what agents are told of storage failures")
struct StorageSpaceTests {
    static let megabyte: Int64 = 1_000_000

    /// A relay whose disk has `free` bytes (as the test sets them) and keeps `reserve` of them.
    static func relay(free: NIOLockedValueBox<Int64>, reserve: Int64) async throws -> Relay {
        let root = TemporaryDirectories.make(prefix: "upload-space-")
        var configuration = RelayConfiguration(certificatePath: "-", privateKeyPath: "-", dataDirectory: root)
        configuration.minFreeBytes = reserve
        let catalog = try SQLiteCatalog(path: configuration.catalogPath)
        try await catalog.addAccount(name: "cam-7", tokenHash: Tokens.hash(Array("t".utf8)), quota: nil)
        let store = try LocalDirectoryStore(root: configuration.storePath, stagingDirectory: configuration.stagingDirectory)
        return Relay(
            configuration: configuration, catalog: catalog, store: store, threadPool: .singleton, logger: Logger(label: "test"),
            measureSpace: { _ in StorageSpace.Look(free: free.withLockedValue { $0 }, size: 1 << 40) }
        )
    }

    enum Answer: Equatable {
        case upload
        case refused(WireErrorCode, String)
    }

    /// The answer to an OPEN of `key`, and for an upload its staging and the session its disk space is promised under.
    static func open(_ key: String, size: Int64, _ relay: Relay) async throws -> (Answer, (any StagingFile)?, String?) {
        let account = try await #require(try relay.catalog.account(named: "cam-7"))
        let open = Frame.Open(streamID: 1, key: key, size: UInt64(size))
        switch await relay.policy.open(account: account, open: open, key: try ObjectKey(validating: key)) {
        case .upload(let session, let staging, _, _, _, _): return (.upload, staging, session.id)
        case .refuse(let code, let message): return (.refused(code, message), nil, nil)
        case .stored, .confirm, .stripe: return (.refused(.internalError, "unexpected answer"), nil, nil)
        }
    }

    static func staged(_ relay: Relay) -> [String] {
        let directory = relay.configuration.stagingDirectory
        return ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).filter { !$0.hasPrefix(".") }
    }

    @Test("inodes are watched as bytes are: an OPEN needs a free file above a twentieth of them, less one per upload open now")
    func inodes() {
        let freeFiles = NIOLockedValueBox<Int64>(60)
        let space = StorageSpace(directory: "/nonexistent", reserve: 0, logger: Logger(label: "test")) { _ in
            StorageSpace.Look(free: 1 << 40, size: 1 << 40, freeFiles: freeFiles.withLockedValue { $0 }, files: 1000)
        }
        #expect(space.fileReserve == 50)
        for index in 0..<10 { #expect(space.admit(1, upload: "u\(index)") == nil, "upload \(index) has a file above the reserve") }
        let refused = space.admit(1, upload: "u10")
        #expect(refused?.contains("storage is full (10 files free for uploads)") == true, "\(refused ?? "admitted")")
        #expect(space.isFull)
        #expect(space.admit(1, upload: "u3") == nil, "an upload open now already has its file")
        space.release(upload: "u0")
        #expect(space.admit(1, upload: "u10") == nil, "an upload that ended gave its file back")
        freeFiles.withLockedValue { $0 = 1_000 }
        #expect(!space.isFull)
        let uncounted = StorageSpace(directory: "/nonexistent", reserve: 0, logger: Logger(label: "test")) { _ in
            StorageSpace.Look(free: 1 << 40, size: 1 << 40)
        }
        #expect(uncounted.admit(1, upload: "u") == nil, "a file system that counts no inodes is judged by bytes")
    }

    @Test(
        "an upload larger than the free space above the reserve is refused at OPEN with STORAGE_ERROR, nothing staged; open uploads' promises count until they end"
    )
    func refusedAtOpen() async throws {
        let free = NIOLockedValueBox<Int64>(50 * Self.megabyte)
        let relay = try await Self.relay(free: free, reserve: Self.megabyte)

        let (big, _, _) = try await Self.open("videos/big.mp4", size: 100 * Self.megabyte, relay)
        guard case .refused(.storageError, let message) = big else {
            Issue.record("a 100 MB upload on a disk with 50 MB free was answered \(big)")
            return
        }
        #expect(message.contains("storage is full") && message.contains("retry later"), "\(message)")
        #expect(!message.contains(relay.configuration.dataDirectory), "the message names the relay's directory: \(message)")
        #expect(Self.staged(relay).isEmpty, "a refused upload staged \(Self.staged(relay))")
        #expect(try await relay.catalog.session(account: "cam-7", key: "videos/big.mp4") == nil)
        #expect(relay.space.isFull == false, "49 MB above the reserve is not full")

        // 30 MB fits; a second 30 MB does not while the first may still write its 30.
        let (first, staging, a) = try await Self.open("a.bin", size: 30 * Self.megabyte, relay)
        #expect(first == .upload)
        let upload = try #require(a)
        let (second, _, _) = try await Self.open("b.bin", size: 30 * Self.megabyte, relay)
        guard case .refused(.storageError, _) = second else {
            Issue.record("two uploads of 30 MB were both admitted on 49 MB: \(second)")
            return
        }
        // The first writes 20 MB (the disk has 20 MB less free): its promise shrinks with them, so 30 MB still does not fit.
        relay.space.wrote(20 * Self.megabyte, upload: upload)
        free.withLockedValue { $0 -= 20 * Self.megabyte }
        await #expect(try Self.open("b.bin", size: 30 * Self.megabyte, relay).0 != .upload)
        let (fits, _, b) = try await Self.open("b.bin", size: 15 * Self.megabyte, relay)
        #expect(fits == .upload)
        relay.space.release(upload: try #require(b))
        // The first ends (its last 10 MB never written): 30 MB of room above the reserve's 1 MB minus nothing promised.
        staging?.close()
        relay.space.release(upload: upload)
        #expect(relay.space.promised == 0)
        await #expect(try Self.open("b.bin", size: 28 * Self.megabyte, relay).0 == .upload)

        // A disk below its reserve is full: even an upload of unknown size is refused, and the status endpoint says so.
        free.withLockedValue { $0 = Self.megabyte / 2 }
        #expect(relay.space.isFull)
    }

    @Test("storage failures reach agents as what they can act on: no path, staging name or bucket")
    func agentMessages() async throws {
        let key = try ObjectKey(validating: "a/b.jpg")
        let logger = Logger(label: "test")
        let full = UploadPolicy.refusal(
            for: StoreError("cannot write 1048576 bytes at offset 52428800 of /srv/relay/staging/4f86: No space left on device", isNoSpace: true),
            doing: "commit", key: key, logger: logger
        )
        #expect(full.code == .storageError && full.message == "the relay's storage is full; retry later")
        let s3 = UploadPolicy.refusal(
            for: StoreError("s3://photos/relay/cam-7/a/b.jpg: HTTP 503 SlowDown", outcomeUnknown: true), doing: "commit", key: key, logger: logger
        )
        #expect(s3.code == .storageError && !s3.message.contains("s3://") && !s3.message.contains("photos"), "\(s3.message)")
        // The catalog's own disk full (SQLite's "database or disk is full") is the relay's storage full: retryable.
        let catalogFull = UploadPolicy.refusal(
            for: DatabaseError(resultCode: .SQLITE_FULL, message: "database or disk is full"), doing: "open the upload", key: key, logger: logger
        )
        #expect(catalogFull.code == .storageError && catalogFull.message == StoreError.fullMessage && catalogFull.keepSession)
        let database = UploadPolicy.refusal(
            for: CatalogError.unavailable("PostgreSQL: password authentication failed for user \"upload\""), doing: "commit", key: key, logger: logger
        )
        #expect(
            database.code == .internalError && !database.message.contains("PostgreSQL") && !database.message.contains("upload\""),
            "\(database.message)")
    }
}
