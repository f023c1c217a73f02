#if canImport(Glibc)
import UploadRelay
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import AsyncHTTPClient
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import UploadChecksums
import UploadProtocol
import UploadS3

/// Objects in an S3-compatible bucket (`--store s3://BUCKET/PREFIX`): the object for key K of account A is
/// `s3://BUCKET/PREFIX/A/K`.
///
/// **Staging is the multipart upload itself**, so that another relay sharing the bucket can resume it. The bytes since
/// the last part wait in a local spool file (never in memory, never synced: nothing in it was acknowledged); a sync with at least a part's worth uploads them
/// as the next part, and only then does the session record its offset and SHA-1 state (the part boundary), so an ACK
/// means the bytes are in an uploaded part. A sync with less keeps them back whole (``StagingFile/sync(through:)``).
/// Once it holds a part, the staging's name carries its upload id and key (`mpu.<hex id>.<hex key>`), recorded with the
/// session: any relay sharing the catalog and the bucket continues the same multipart upload, after listing its parts.
///
/// Commit: the rest goes up as the last part and CompleteMultipartUpload makes the object; an upload that never
/// reached a part goes up as one PutObject with `x-amz-checksum-sha1`. Both with `If-None-Match: *` unless the agent
/// asked to overwrite. Parts carry their `x-amz-checksum-sha1`. Dedup is a server-side CopyObject.
///
/// Not supported: striped uploads (SPEC §6.7; the relay does not offer STRIPES with this store).
///
/// Calls are async, as the protocol says: a request is awaited without holding a thread, and the spool's system calls
/// run on the store's thread pool.
public final class S3Store: BlobStore, Sendable {
    public let client: S3Client
    public let bucket: String
    /// The prefix every object key gets (`photos/` in `s3://bucket/photos`), with its trailing slash; may be empty.
    public let prefix: String
    /// Where the bytes since the last part wait (local, same machine).
    public let spoolDirectory: String
    /// The least size of a part but the last: 5 MiB, S3's least.
    public let minPartBytes: Int64
    /// How long a multipart upload no session records must exist before cleanup aborts it: another relay sharing the
    /// bucket creates one just before its first part and records it just after.
    public let orphanGrace: TimeInterval
    /// The modes of the spool directory and files.
    public let modes: FileModes
    /// Where the multipart uploads the relays begin are recorded before they begin (the catalog): cleanup aborts those
    /// alone, never another writer's in a shared bucket. Nil: cleanup aborts no multipart upload it finds.
    public let ledger: (any MultipartLedger)?
    /// Where the spool's system calls run.
    public let threadPool: NIOThreadPool
    /// The stagings it opened that are alive: only those are committed.
    let opened = StagingRegistry<S3StagingFile>()
    private let logger: Logger?

    /// S3's least part size (but the last).
    public static let s3MinPartBytes: Int64 = S3StoreConfiguration.s3MinPartBytes
    /// S3's most parts in one upload.
    public static let maxParts: Int64 = 10_000
    /// The part size for a blob of unknown size: 10,000 of them make 160 GiB.
    public static let unknownSizePartBytes: Int64 = 16 << 20

    public init(
        client: S3Client, bucket: String, prefix: String, spoolDirectory: String, minPartBytes: Int64 = S3Store.s3MinPartBytes,
        orphanGrace: TimeInterval = 3600, modes: FileModes = .private, ledger: (any MultipartLedger)? = nil, logger: Logger? = nil,
        threadPool: NIOThreadPool = .singleton, commitsAtOnce: Int = S3StoreConfiguration.defaultCommitsAtOnce
    ) throws {
        self.threadPool = threadPool
        self.commitsAtOnce = max(1, commitsAtOnce)
        self.ledger = ledger
        self.logger = logger
        self.client = client
        self.bucket = bucket
        let trimmed = prefix.split(separator: "/").joined(separator: "/")
        self.prefix = trimmed.isEmpty ? "" : trimmed + "/"
        self.spoolDirectory = FileSystem.trimmed(spoolDirectory)
        self.minPartBytes = max(1, minPartBytes)
        self.orphanGrace = orphanGrace
        self.modes = modes
        try FileSystem.makeDirectories(self.spoolDirectory, mode: modes.directory)
    }

    /// Parses `s3://BUCKET[/PREFIX]`; nil when `url` is not one.
    public static func parse(_ url: String) -> (bucket: String, prefix: String)? {
        guard url.lowercased().hasPrefix("s3://") else { return nil }
        let rest = url.dropFirst(5)
        let bucket = rest.prefix { $0 != "/" }
        guard !bucket.isEmpty else { return nil }
        return (String(bucket), String(rest.dropFirst(bucket.count)).trimmingCharacters(in: CharacterSet(charactersIn: "/")))
    }

    public func location(of key: ObjectKey, account: String) throws -> String {
        "s3://" + self.bucket + "/" + self.objectKey(key, account: account)
    }

    /// The bucket key of `key` of `account`.
    public func objectKey(_ key: ObjectKey, account: String) -> String {
        self.prefix + account + "/" + key.value
    }

    /// S3's largest object (5 TiB): the relay's largest blob with this store.
    public static let maxObjectBytes: Int64 = 5 << 40
    /// S3's longest key, in bytes.
    public static let maxKeyBytes = 1024

    /// The least size of part `number` of a blob of `size` bytes, so that it fits in 10,000 parts. Of unknown size, the
    /// parts double every 1,000 (16 MiB, then 32 MiB, ...): acknowledgements come every 16 MiB at first, and 10,000 parts
    /// still hold 5 TiB.
    func partBytes(number: Int, size: Int64?) -> Int64 {
        guard let size else {
            let doublings = min(9, (max(1, number) - 1) / 1000)
            return max(self.minPartBytes, Self.unknownSizePartBytes << doublings)
        }
        return max(self.minPartBytes, (size + Self.maxParts - 1) / Self.maxParts)
    }

    // MARK: Staging

    /// No stripes (a multipart upload's parts are written in order, and are not read back); no object above S3's
    /// largest.
    public var capabilities: StoreCapabilities { StoreCapabilities(stripes: false, largestObject: Self.maxObjectBytes) }

    public func openStaging(_ request: StagingRequest) async throws -> any StagingFile {
        switch request.layout {
        case .sequential(let offset, let parts):
            return try await self.openStaging(
                request.name, for: request.key, account: request.account, truncatingTo: offset, expectedSize: request.expectedSize, parts: parts
            )
        case .striped:
            throw StoreError("striped uploads are not supported with an S3 store (its capabilities say so: the relay offers none)")
        }
    }

    private func openStaging(
        _ name: String, for key: ObjectKey, account: String, truncatingTo offset: Int64, expectedSize: Int64?, parts recorded: [StagedPart]
    ) async throws -> S3StagingFile {
        let objectKey = self.objectKey(key, account: account)
        var upload: (id: String, parts: [StagedPart])? = nil
        if let named = Self.upload(inName: name) {
            guard named.key == objectKey else {
                throw StoreError("staging \(name) is a multipart upload of \(named.key), not of \(objectKey)")
            }
            guard offset > 0 else {
                // Nothing of it is durable for this session: start clean.
                try await self.removeStaging(name)
                return try self.newStaging(
                    name: Self.randomName(), key: key, account: account, objectKey: objectKey, expectedSize: expectedSize, upload: nil, base: 0
                )
            }
            // The recorded parts that make exactly the durable offset, 1, 2, ... in order; any after them were uploaded
            // by a relay that stopped before recording them, and are replaced.
            var parts: [StagedPart] = []
            for part in recorded.sorted(by: { $0.number < $1.number }) where part.number == parts.count + 1 && part.end <= offset {
                parts.append(part)
            }
            guard parts.last?.end == offset else {
                throw StoreError("the recorded parts of multipart upload \(named.id) of \(objectKey) do not end at the durable \(offset)")
            }
            // The upload must still be there, with those parts (an abort, or a lifecycle rule, may have taken it).
            let listed = try await self.request { try await self.client.listParts(bucket: self.bucket, key: objectKey, uploadID: named.id) }
            let etags = Dictionary(listed.map { ($0.part.number, Self.bare($0.part.etag)) }, uniquingKeysWith: { a, _ in a })
            guard parts.allSatisfy({ etags[$0.number] == Self.bare($0.etag) }) else {
                throw StoreError("multipart upload \(named.id) of s3://\(self.bucket)/\(objectKey) no longer holds its recorded parts")
            }
            upload = (named.id, parts)
        } else if offset > 0 {
            throw StoreError("staging \(name) holds no multipart upload, so not its \(offset) durable bytes")
        }
        return try self.newStaging(
            name: name, key: key, account: account, objectKey: objectKey, expectedSize: expectedSize, upload: upload, base: offset
        )
    }

    private func newStaging(
        name: String, key: ObjectKey, account: String, objectKey: String, expectedSize: Int64?, upload: (id: String, parts: [StagedPart])?,
        base: Int64
    )
        throws -> S3StagingFile
    {
        let spool = self.spoolDirectory + "/" + Self.randomName() + ".spool"
        let fd = open(spool, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, self.modes.file)
        guard fd >= 0 else {
            throw StoreError("cannot create spool file \(spool): \(FileSystem.reason())", isNoSpace: errno == ENOSPC)
        }
        return self.opened.registered(
            S3StagingFile(
                store: self, name: name, key: key, account: account, objectKey: objectKey, spoolPath: spool, descriptor: fd, base: base,
                upload: upload, expectedSize: expectedSize
            )
        )
    }

    public func removeStaging(_ name: String) async throws {
        if let upload = Self.upload(inName: name) {
            try await self.request { try await self.client.abortMultipartUpload(bucket: self.bucket, key: upload.key, uploadID: upload.id) }
            try await self.forgetIntents(of: upload.id, key: upload.key)
        } else if name.hasSuffix(".spool"), !name.contains("/") {
            unlink(self.spoolDirectory + "/" + name)
        }
    }

    public func hasStaging(_ name: String) async throws -> Bool {
        guard let upload = Self.upload(inName: name) else { return false }
        let uploads = try await self.request { try await self.client.listMultipartUploads(bucket: self.bucket, prefix: upload.key) }
        return uploads.contains { $0.uploadID == upload.id && $0.key == upload.key }
    }

    /// Spool files left by a relay that stopped, and the multipart uploads under the prefix that the ledger says the
    /// relays began (cleanup keeps those a session names, and aborts the others once no upload holds their key). A
    /// multipart upload the ledger does not name is another writer's: it is never listed here, so never aborted.
    ///
    /// An intent whose upload completed or was aborted is forgotten here; one whose relay stopped before its
    /// CreateMultipartUpload was answered names the uploads of its key begun since it was recorded (a few minutes'
    /// leeway for the clocks), and is forgotten once ``orphanGrace`` passed with none.
    public func stagingFiles() async throws -> [(name: String, modified: Date)] {
        var found: [(name: String, modified: Date)] = []
        if let entries = try? FileManager.default.contentsOfDirectory(atPath: self.spoolDirectory) {
            for entry in entries where entry.hasSuffix(".spool") {
                var info = stat()
                guard stat(self.spoolDirectory + "/" + entry, &info) == 0 else { continue }
                found.append((entry, Date(timeIntervalSince1970: TimeInterval(info.st_mtim.tv_sec))))
            }
        }
        guard let ledger = self.ledger else { return found }
        // Read before the listing: an intent with an upload id here has its upload in the listing, unless it ended.
        let intents = try await ledger.multipartIntents()
        let uploads = try await self.request { try await self.client.listMultipartUploads(bucket: self.bucket, prefix: self.prefix) }
        var ours = Set<String>()
        let now = Date()
        for intent in intents {
            let matching = uploads.filter { upload in
                guard upload.key == intent.objectKey else { return false }
                if let id = intent.uploadID { return upload.uploadID == id }
                // Begun right after its intent was recorded: within the clocks' leeway of it, either side.
                guard let begun = Self.date(upload.initiated) else { return false }
                return abs(begun.timeIntervalSince(intent.createdAt)) <= Self.clockLeeway
            }
            for upload in matching {
                ours.insert(upload.uploadID)
                found.append((Self.name(uploadID: upload.uploadID, key: upload.key), Self.date(upload.initiated) ?? .distantPast))
            }
            let begunAndGone = intent.uploadID != nil && matching.isEmpty
            let neverBegun = intent.uploadID == nil && matching.isEmpty && intent.createdAt < now.addingTimeInterval(-self.orphanGrace)
            if begunAndGone || neverBegun { try await ledger.forgetMultipartIntent(id: intent.id) }
        }
        let foreign = uploads.filter { !ours.contains($0.uploadID) }
        if !foreign.isEmpty {
            self.logger?.warning(
                "multipart uploads under the store's prefix that no relay of this catalog began: left alone (give the relays a prefix of their own)",
                metadata: ["s3.bucket": "\(self.bucket)", "s3.prefix": "\(self.prefix)", "uploads": "\(foreign.count)"]
            )
        }
        return found
    }

    /// How far from its intent's record a multipart upload may seem to begin (the bucket's clock against the relay's,
    /// and the request's time) and still be the intent's.
    static let clockLeeway: TimeInterval = 300

    /// The upload `id` of `key` ended (completed or aborted): the ledger forgets it.
    func forgetIntents(of id: String, key: String) async throws {
        guard let ledger = self.ledger else { return }
        for intent in try await ledger.multipartIntents() where intent.objectKey == key && intent.uploadID == id {
            try await ledger.forgetMultipartIntent(id: intent.id)
        }
    }

    /// The account and key of a multipart upload under the prefix, by its staging name.
    public func stagingOwner(_ name: String) -> (account: String, key: String)? {
        guard let upload = Self.upload(inName: name), upload.key.hasPrefix(self.prefix) else { return nil }
        let rest = upload.key.dropFirst(self.prefix.count)
        guard let slash = rest.firstIndex(of: "/") else { return nil }
        let (account, key) = (String(rest[..<slash]), String(rest[rest.index(after: slash)...]))
        guard Account.isValidName(account), (try? ObjectKey(validating: key)) != nil else { return nil }
        return (account, key)
    }

    /// Only the bytes since the last part wait on the relay's disk, in the spool: less than two parts.
    public func localSpace(forBlobOf size: Int64) -> (directory: String, bytes: Int64) {
        (self.spoolDirectory, min(size, 2 * self.partBytes(number: 1, size: size)))
    }

    // MARK: Objects

    /// The uploads of a commit group, each made an object (its last part or PutObject, then a HEAD for its identity),
    /// ``commitsAtOnce`` of them at a time: one after the other, each waited on two round trips, and a directory of
    /// 1 MiB photos went at 0.6 times rclone's rate to the same server. Results in the batch's order.
    public func commit(_ batch: [StoreCommit]) async -> [Result<ObjectIdentity, any Error>] {
        await withTaskGroup(of: (Int, Result<ObjectIdentity, any Error>).self) { group in
            var results = [Result<ObjectIdentity, any Error>?](repeating: nil, count: batch.count)
            for (index, item) in batch.enumerated() {
                if index >= self.commitsAtOnce, let (done, result) = await group.next() { results[done] = result }
                group.addTask {
                    do {
                        let identity = try await self.commit(
                            item.staging, as: item.key, account: item.account, sha1: item.sha1, overwrite: item.overwrite)
                        return (index, .success(identity))
                    } catch {
                        return (index, .failure(error))
                    }
                }
            }
            for await (done, result) in group { results[done] = result }
            return results.map { $0 ?? .failure(StoreError("the commit of this upload never ended")) }
        }
    }

    /// The most uploads of one commit group made objects at once (``commit(_:)``).
    let commitsAtOnce: Int

    private func commit(
        _ staging: any StagingFile, as key: ObjectKey, account: String, sha1: SHA1Digest?, overwrite: Bool
    ) async throws -> ObjectIdentity {
        guard let staging = self.opened.own(staging) else { throw StoreError("staging \(staging.name) is not this store's S3 upload") }
        let objectKey = self.objectKey(key, account: account)
        guard objectKey == staging.objectKey else {
            throw StoreError("staging of s3://\(self.bucket)/\(staging.objectKey) cannot become \(objectKey)")
        }
        do {
            try await staging.finish(sha1: sha1, ifNoneMatch: !overwrite)
        } catch let error as StoreError where error.outcomeUnknown {
            // S3 may have made the object: recovery settles it (HEAD and SHA-1), never a blind retry into a 412.
            throw StoreError(error.description, madeVisible: true)
        }
        do {
            guard let identity = try await self.identity(ofBucketKey: objectKey) else {
                throw StoreError("s3://\(self.bucket)/\(objectKey) is not there after its commit")
            }
            return identity
        } catch let error as StoreError {
            throw StoreError(error.description, madeVisible: true)
        } catch {
            throw StoreError("\(error)", madeVisible: true)
        }
    }

    public func duplicate(_ source: ObjectKey, expected: ObjectIdentity, as key: ObjectKey, account: String) async throws -> ObjectIdentity {
        let from = self.objectKey(source, account: account)
        let to = self.objectKey(key, account: account)
        guard let info = try await self.request({ try await self.client.headObject(bucket: self.bucket, key: from) }),
            Self.identity(info) == expected
        else {
            throw StoreError("s3://\(self.bucket)/\(from) changed since it was verified")
        }
        do {
            try await self.request { try await self.client.copyObject(bucket: self.bucket, from: from, to: to, sourceETag: info.etag) }
        } catch let error as StoreError where error.outcomeUnknown {
            throw StoreError(error.description, madeVisible: true)
        }
        guard let identity = try await self.identity(ofBucketKey: to), identity.size == expected.size else {
            throw StoreError("s3://\(self.bucket)/\(to) is not the copy of \(from) after its copy", madeVisible: true)
        }
        return identity
    }

    public func removeObject(_ key: ObjectKey, account: String) async throws {
        let objectKey = self.objectKey(key, account: account)
        try await self.request { try await self.client.deleteObject(bucket: self.bucket, key: objectKey) }
    }

    public func identity(of key: ObjectKey, account: String) async throws -> ObjectIdentity? {
        try await self.identity(ofBucketKey: self.objectKey(key, account: account))
    }

    /// An object's identity is its size and ETag (there is no inode): the ETag's FNV-1a hash stands in the inode.
    func identity(ofBucketKey key: String) async throws -> ObjectIdentity? {
        try await self.request({ try await self.client.headObject(bucket: self.bucket, key: key) }).map(Self.identity)
    }

    static func identity(_ info: S3ObjectInfo) -> ObjectIdentity {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in Self.bare(info.etag).utf8 {
            hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3
        }
        return ObjectIdentity(device: 0, inode: hash, size: info.size, modified: 0)
    }

    public func contentSHA1(of key: ObjectKey, account: String) async throws -> SHA1Digest? {
        let objectKey = self.objectKey(key, account: account)
        guard let info = try await self.request({ try await self.client.headObject(bucket: self.bucket, key: objectKey) }) else { return nil }
        var sha1 = SHA1()
        var offset: Int64 = 0
        let piece: Int64 = 8 << 20
        while offset < info.size {
            let range = offset...(min(info.size, offset + piece) - 1)
            let end = range.upperBound
            let bytes = try await self.request {
                try await self.client.getObject(bucket: self.bucket, key: objectKey, range: range, maxBytes: Int(piece))
            }
            guard bytes.readableBytes == Int(end - offset + 1) else {
                throw StoreError("s3://\(self.bucket)/\(objectKey) changed while it was read")
            }
            bytes.withUnsafeReadableBytes { sha1.update($0) }
            offset = end + 1
        }
        return SHA1Digest(bytes: sha1.finalize())
    }

    /// S3 has no folders: any key goes beside any other, if its bucket key is not too long.
    public func conflict(for key: ObjectKey, account: String) async throws -> String? {
        let length = self.objectKey(key, account: account).utf8.count
        guard length > Self.maxKeyBytes else { return nil }
        return "S3 takes keys of at most \(Self.maxKeyBytes) bytes; with the relay's prefix and the account this key makes \(length): \"\(key)\""
    }

    // MARK: Names

    /// `mpu.<hex upload id>.<hex bucket key>`: what cleanup and a resume need, from the name alone.
    static func name(uploadID: String, key: String) -> String {
        "mpu." + Array(uploadID.utf8).hexString + "." + Array(key.utf8).hexString
    }

    static func upload(inName name: String) -> (id: String, key: String)? {
        let parts = name.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0] == "mpu", let id = Self.unhex(parts[1]), let key = Self.unhex(parts[2]) else { return nil }
        return (id, key)
    }

    static func randomName() -> String {
        UploadPolicy.randomID()
    }

    static func unhex(_ text: Substring) -> String? {
        [UInt8](hexString: String(text)).flatMap { String(validating: $0, as: UTF8.self) }
    }

    /// An ETag without its quotes: servers quote it in headers and listings, or not, each its own way.
    static func bare(_ etag: String) -> String {
        etag.trimmingCharacters(in: CharacterSet(charactersIn: "\""))
    }

    static func date(_ text: String) -> Date? {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        if let date = formatter.date(from: text) { return date }
        formatter.formatOptions = [.withInternetDateTime]
        return formatter.date(from: text)
    }

    // MARK: Requests

    /// Runs `body`, S3's errors as ``StoreError``.
    func request<T: Sendable>(_ body: @Sendable () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch let error as S3Error {
            throw StoreError(
                error.description, isNoSpace: error.code == "EntityTooLarge", alreadyExists: error.isPreconditionFailed,
                outcomeUnknown: error.outcomeUnknown
            )
        }
    }
}
