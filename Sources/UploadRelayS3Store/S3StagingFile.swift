#if canImport(Glibc)
import UploadRelay
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import UploadChecksums
import UploadProtocol
import UploadS3

/// One upload's staging in S3: its multipart upload (created at its first part) and the spool of the bytes since.
final class S3StagingFile: StagingFile, @unchecked Sendable {
    /// The name it was opened under, before its multipart upload exists.
    let openedName: String
    let key: ObjectKey
    let account: String
    let objectKey: String
    private let store: S3Store
    private let spoolPath: String
    /// The blob's announced size (nil: unknown), which sets the least part size.
    private let expectedSize: Int64?
    /// Guards the state for ``name`` and ``close()``; every other call runs under ``serial``, one at a time (a part's
    /// upload included).
    private let lock = NIOLock()
    private let serial = AsyncLock()
    /// Calls under way (under ``lock``): a ``close()`` meanwhile waits for them to end, so that no spool read or part
    /// upload ever meets a closed (or reused) descriptor.
    private var busy = 0
    private var closeWhenIdle = false
    private var descriptor: Int32
    /// Bytes in uploaded parts.
    private var base: Int64
    /// Bytes in the spool, from `base` on.
    private var spooled: Int64 = 0
    private var upload: (id: String, parts: [StagedPart])?
    /// Parts uploaded and not yet taken for the catalog.
    private var unrecorded: [StagedPart] = []

    init(
        store: S3Store, name: String, key: ObjectKey, account: String, objectKey: String, spoolPath: String, descriptor: Int32, base: Int64,
        upload: (id: String, parts: [StagedPart])?, expectedSize: Int64?
    ) {
        self.store = store
        self.openedName = name
        self.key = key
        self.account = account
        self.objectKey = objectKey
        self.spoolPath = spoolPath
        self.descriptor = descriptor
        self.base = base
        self.upload = upload
        self.expectedSize = expectedSize
    }

    deinit {
        self.store.opened.forget(ObjectIdentifier(self))
        if self.descriptor >= 0 {
            Glibc.close(self.descriptor)
            unlink(self.spoolPath)
        }
    }

    /// Its multipart upload's, once it has one.
    var name: String {
        self.lock.withLock { self.upload.map { S3Store.name(uploadID: $0.id, key: self.objectKey) } ?? self.openedName }
    }

    func write(_ bytes: ByteBuffer, at offset: Int64) async throws {
        try await self.operation {
            try await self.store.threadPool.runBlocking { try self.spool(bytes, at: offset) }
        }
    }

    /// Writes `bytes` at `offset` of the blob into the spool, on the caller's thread.
    private func spool(_ bytes: ByteBuffer, at offset: Int64) throws {
        guard self.descriptor >= 0 else { throw StoreError("staging of \(self.objectKey) is closed") }
        let at = offset - self.base
        guard at >= 0 else { throw StoreError("write at \(offset), below the \(self.base) bytes in parts of \(self.objectKey)") }
        var done = 0
        let count = bytes.readableBytes
        try bytes.withUnsafeReadableBytes { raw in
            guard let start = raw.baseAddress else { return }
            while done < count {
                let n = pwrite(self.descriptor, start + done, count - done, off_t(at) + off_t(done))
                if n < 0 {
                    if errno == EINTR { continue }
                    throw StoreError("cannot write spool file \(self.spoolPath): \(FileSystem.reason())", isNoSpace: errno == ENOSPC)
                }
                done += n
            }
        }
        self.spooled = max(self.spooled, at + Int64(count))
    }

    /// Nothing of S3's is durable short of a part: see ``sync(through:)``. The parts it uploads are reported by the next
    /// ``sync(through:)``.
    func sync() async throws {
        try await self.operation { _ = try await self.uploadDue(through: self.base + self.spooled) }
    }

    /// The offset the caller records must be a part boundary: a resume takes up the recorded parts that end exactly at
    /// the durable offset, and starts over otherwise. When ``sync()`` uploaded past `offset` meanwhile, `offset` is
    /// durable only if a part ends there (then the parts up to it are reported, the later ones at a later offset);
    /// otherwise nothing new is (``StagingSync/heldBack``).
    func sync(through offset: Int64) async throws -> StagingSync {
        try await self.operation {
            guard try await self.uploadDue(through: offset) else { return .heldBack }
            guard offset >= self.base || offset == 0 || self.upload?.parts.contains(where: { $0.end == offset }) == true else {
                return .heldBack
            }
            let reported = self.unrecorded.prefix { $0.end <= offset }
            self.unrecorded.removeFirst(reported.count)
            return .durable(newParts: Array(reported))
        }
    }

    /// Uploads the bytes below `offset` as the next part when they make one; false when they are too few and wait.
    /// Under ``serial``.
    private func uploadDue(through offset: Int64) async throws -> Bool {
        let pending = offset - self.base
        guard pending > 0 else { return true }
        let next = (self.upload?.parts.count ?? 0) + 1
        guard pending >= self.store.partBytes(number: next, size: self.expectedSize) else { return false }
        try await self.uploadPart(bytes: pending)
        return true
    }

    /// Uploads the first `count` spooled bytes as the next part (creating the upload first), then empties the spool.
    private func uploadPart(bytes count: Int64) async throws {
        let (sha1, sha256) = try await self.store.threadPool.runBlocking { try self.hashSpool(count) }
        let body = S3Body.file(descriptor: self.descriptor, offset: 0, length: count, sha256: sha256)
        let (store, key) = (self.store, self.objectKey)
        let id: String
        if let upload = self.upload {
            id = upload.id
        } else {
            // Recorded before it exists: cleanup aborts only what the ledger names (never another writer's upload).
            let intent = try await store.ledger?.recordMultipartIntent(account: self.account, key: self.key.value, objectKey: key)
            id = try await store.request { try await store.client.createMultipartUpload(bucket: store.bucket, key: key, sha1Checksums: true) }
            self.lock.withLock { self.upload = (id, []) }
            if let intent { try await store.ledger?.recordMultipartUpload(intent: intent, uploadID: id) }
        }
        let number = (self.upload?.parts.count ?? 0) + 1
        let part = try await store.request {
            try await store.client.uploadPart(bucket: store.bucket, key: key, uploadID: id, number: number, body: body, sha1: sha1)
        }
        let staged = StagedPart(number: number, end: self.base + count, etag: part.etag, sha1: sha1)
        self.lock.withLock { self.upload?.parts.append(staged) }
        self.unrecorded.append(staged)
        self.base += count
        self.spooled -= count
        guard self.spooled == 0, ftruncate(self.descriptor, 0) == 0 else {
            throw StoreError("cannot empty spool file \(self.spoolPath): \(FileSystem.reason())")
        }
    }

    /// The SHA-1 (base64, for `x-amz-checksum-sha1`) and SHA-256 (hex, for the signature) of the first `count` spooled
    /// bytes, read a MiB at a time: a part is then sent from the file, never held in memory whole. Over HTTPS the body
    /// goes unsigned (``S3Client/signsChecksummedPayloads``): no SHA-256 then, a third less hashing per byte.
    private func hashSpool(_ count: Int64) throws -> (sha1: String, sha256: String) {
        var sha1 = SHA1()
        var sha256: SHA256? = self.store.client.signsChecksummedPayloads ? SHA256() : nil
        let piece = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer { piece.deallocate() }
        var done: Int64 = 0
        while done < count {
            let want = Int(min(Int64(piece.count), count - done))
            guard let base = piece.baseAddress else { break }
            let n = pread(self.descriptor, base, want, off_t(done))
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { throw StoreError("spool file \(self.spoolPath) ends at \(done) of \(count) bytes") }
            let bytes = UnsafeRawBufferPointer(rebasing: piece[0..<n])
            sha1.update(bytes)
            sha256?.update(bytes)
            done += Int64(n)
        }
        return (Data(sha1.finalize()).base64EncodedString(), sha256.map { Array($0.finalize()).hexString } ?? SigV4Signer.unsignedPayload)
    }

    /// The object: the spool as one PutObject when no part went up, else as the last part and CompleteMultipartUpload.
    func finish(sha1: SHA1Digest?, ifNoneMatch: Bool) async throws {
        try await self.operation {
            let (store, key) = (self.store, self.objectKey)
            if self.upload == nil {
                // The SHA-1 of the spool, not the one verified: S3 then checks that what it got is what was spooled, and
                // the relay compared the verified one with HASH already.
                let spooled = self.spooled
                let (checksum, sha256) = try await store.threadPool.runBlocking { try self.hashSpool(spooled) }
                if let sha1, Data(sha1.bytes).base64EncodedString() != checksum {
                    throw StoreError("the spool of \(key) does not hold the bytes verified (SHA-1 \(sha1))")
                }
                let body = S3Body.file(descriptor: self.descriptor, offset: 0, length: self.spooled, sha256: sha256)
                _ = try await store.request {
                    try await store.client.putObject(bucket: store.bucket, key: key, body: body, sha1: checksum, ifNoneMatch: ifNoneMatch)
                }
                return
            }
            if self.spooled > 0 { try await self.uploadPart(bytes: self.spooled) }
            guard let upload = self.upload else { return }
            try await store.request {
                try await store.client.completeMultipartUpload(
                    bucket: store.bucket, key: key, uploadID: upload.id,
                    parts: upload.parts.map { S3Part(number: $0.number, etag: $0.etag, checksumSHA1: $0.sha1) }, ifNoneMatch: ifNoneMatch
                )
            }
            // Completed: nothing left to clean up. (If this record fails, cleanup forgets it once the upload is gone.)
            try? await store.forgetIntents(of: upload.id, key: key)
        }
    }

    /// Only the spool can be read back (striped uploads, which read back, are not offered with this store).
    func read(_ count: Int, at offset: Int64) async throws -> ByteBuffer {
        throw StoreError("the bytes of s3://\(self.store.bucket)/\(self.objectKey) are in parts; they are not read back")
    }

    /// Closes the spool now, or once the call under way ends.
    func close() {
        let now = self.lock.withLock { () -> Bool in
            guard self.busy == 0 else {
                self.closeWhenIdle = true
                return false
            }
            return true
        }
        if now { self.closeSpool() }
    }

    private func closeSpool() {
        self.lock.withLock {
            guard self.descriptor >= 0 else { return }
            Glibc.close(self.descriptor)
            self.descriptor = -1
            unlink(self.spoolPath)
        }
    }

    /// Runs `body` under ``serial``, counted as under way for ``close()``.
    private func operation<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        try await self.serial.withLock {
            self.lock.withLock { self.busy += 1 }
            defer {
                let close = self.lock.withLock { () -> Bool in
                    self.busy -= 1
                    return self.busy == 0 && self.closeWhenIdle
                }
                if close { self.closeSpool() }
            }
            return try await body()
        }
    }
}
