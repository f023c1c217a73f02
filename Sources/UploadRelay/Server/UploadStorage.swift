import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import UploadChecksums
import UploadPayload
import UploadProtocol
import CoreMetrics

/// The storage work of one upload, each step an async function of the step: open and write chunks, sync and record,
/// verify and commit, release. No thread and no event loop of its own: ``UploadExecutor`` runs ``perform(_:)`` as a
/// task, the in-memory test relay awaits it in line. It decides nothing: the steps come from the upload's
/// ``UploadPipeline``.
///
/// The pipeline starts one step at a time, so the SHA-1 state and the staging file are never touched by two tasks at
/// once; the locks only make that visible to the compiler (a step takes the SHA-1 state out, and puts it back).
package final class UploadStorage: Sendable {
    /// What the storage of every upload shares: the catalog and store, the group commit, the disk's accounting and the
    /// metrics. Nothing above storage (no policy, no server).
    package struct Context: Sendable {
        var catalog: any SessionCatalog
        var store: any BlobStore
        var commits: CommitGroup
        var space: StorageSpace
        var metrics: RelayMetrics
    }

    private let key: ObjectKey
    /// The principal the upload's connection authenticated as; its commit is refused once it no longer is one.
    private let account: Account
    private let overwrite: Bool
    private let session: UploadSession
    private let staging: any StagingFile
    private let context: Context
    private let logger: Logger
    /// The SHA-1 of the bytes written so far.
    private let sha1: NIOLockedValueBox<SHA1>
    /// Whether the catalog holds the session: a resumed one does, and one longer than a sync from its OPEN; a new one
    /// otherwise from its first durable sync on.
    private let recorded: NIOLockedValueBox<Bool>
    /// The staging name the catalog holds for the session, while it holds it. A store may rename the staging once it holds
    /// durable bytes (S3: the name comes to carry its multipart upload); a session recorded at its OPEN is then recorded
    /// again, whole, with its new name, so that a resume finds it.
    private let recordedName: NIOLockedValueBox<String?>
    /// The bytes durable so far (counted in the metrics as they become so).
    private let durable: NIOLockedValueBox<Int64>
    /// Whether a commit was asked for: from then on the session may be a pending commit's, which recovery settles.
    private let commitAsked = NIOLockedValueBox(false)
    /// The SHA-1 of the first ``Frame/Open/probeLength`` bytes, recorded with the object for the dedup probe (SPEC §7.1):
    /// taken from ``sha1`` as it passes that length, so those bytes are hashed once. Nil until then, and for an upload
    /// resumed past it (the relay does not read its staged prefix back for it).
    private let probe: NIOLockedValueBox<SHA1Digest?>
    /// For a PART stream (SPEC §6.7): the stripe it writes, whose offset 0 is `base` in the staging file. Its bytes are
    /// hashed with the whole blob when the main stream commits; its "commit" makes them durable and records the stripe.
    private let stripe: (index: Int, base: Int64, length: Int64)?

    init(
        key: ObjectKey, account: Account, overwrite: Bool, session: UploadSession, recorded: Bool, staging: any StagingFile, sha1: SHA1,
        context: Context, logger: Logger, stripe: Int? = nil
    ) {
        let stripes = Frame.Stripes(size: UInt64(session.declaredSize ?? 0))
        self.stripe = stripe.map { ($0, Int64(stripes.start(of: $0)), Int64(stripes.length(of: $0))) }
        self.key = key
        self.account = account
        self.overwrite = overwrite
        self.session = session
        self.recorded = NIOLockedValueBox(recorded)
        self.recordedName = NIOLockedValueBox(recorded ? session.stagingName : nil)
        self.durable = NIOLockedValueBox(session.durableOffset)
        self.staging = staging
        self.sha1 = NIOLockedValueBox(sha1)
        self.probe = NIOLockedValueBox(nil)
        self.context = context
        self.logger = logger
    }

    /// Runs one step; its completion for the session (for a commit, once its group is durable: ``CommitGroup``).
    package func perform(_ step: UploadPipeline.StorageStep) async -> RelaySession.StorageCompletion {
        switch step {
        case .write(let chunks, let offset):
            let (consumed, error) = await self.write(chunks, at: offset)
            return .wrote(consumed: consumed, error: error.map { ($0.code, $0.message) })
        case .sync(let offset):
            let start = ContinuousClock.now
            let result: Result<Int64, UploadPipeline.SyncFailure>
            do {
                result = .success(try await self.sync(through: offset))
            } catch {
                result = .failure(self.syncFailure(error))
            }
            self.context.metrics.syncSeconds.recordInterval(since: start)
            return .synced(result)
        case .commit(let hash, let written):
            let start = ContinuousClock.now
            let result = await self.commit(hash, written: written)
            self.context.metrics.commitSeconds.recordInterval(since: start)
            return .committed(result)
        case .release(let discardSession):
            await self.release(discardSession: discardSession)
            return .released
        }
    }

    /// Opens each chunk (inflate, CRC-32), writes its raw bytes and hashes them; the payload bytes consumed per chunk, and
    /// the error that stopped the batch.
    private func write(_ chunks: [Frame.Chunk], at startOffset: Int64) async -> ([Int], ProtocolError?) {
        let base = self.stripe?.base ?? 0
        var sha1 = self.sha1.withLockedValue { $0 }
        var offset = startOffset
        var consumed: [Int] = []
        var error: ProtocolError? = nil
        for chunk in chunks {
            switch ChunkPayload.open(chunk) {
            case .failure(let failure):
                error = failure
            case .success(let raw):
                do {
                    try await self.staging.write(raw, at: base + offset)
                    // A stripe's bytes are hashed in order with the whole blob, at the main stream's commit.
                    if self.stripe == nil { raw.withUnsafeReadableBytes { self.hash($0, into: &sha1) } }
                    offset += Int64(raw.readableBytes)
                    consumed.append(chunk.payloadLength)
                } catch let failure {
                    self.context.metrics.failed("store", "write")
                    error = .stream(chunk.streamID, .storageError, self.agentMessage(failure, doing: "write"))
                }
            }
            if error != nil { break }
        }
        self.sha1.withLockedValue { $0 = sha1 }
        let written = offset - startOffset
        // What was written counts in the disk's free space now: the upload's promise shrinks by it, once per batch (the
        // promises' lock is every upload's).
        if self.stripe == nil && written > 0 { self.context.space.wrote(written, upload: self.session.id) }
        return (consumed, error)
    }

    /// Hashes `bytes`, keeping the digest of the first ``Frame/Open/probeLength`` bytes when they end within them.
    private func hash(_ bytes: UnsafeRawBufferPointer, into sha1: inout SHA1) {
        let limit = Frame.Open.probeLength
        guard sha1.byteCount < limit, sha1.byteCount + UInt64(bytes.count) >= limit else {
            sha1.update(bytes)
            return
        }
        let head = Int(limit - sha1.byteCount)
        sha1.update(UnsafeRawBufferPointer(rebasing: bytes.prefix(head)))
        let digest = SHA1Digest(bytes: sha1.finalize())
        self.probe.withLockedValue { $0 = digest }
        sha1.update(UnsafeRawBufferPointer(rebasing: bytes.dropFirst(head)))
    }

    /// The probe digest to record for a blob of `size` bytes: only above the probe length, and only when this upload
    /// wrote the bytes at that length.
    private func probeDigest(size: UInt64) -> String? {
        guard size > Frame.Open.probeLength else { return nil }
        return self.probe.withLockedValue { $0?.hex }
    }

    /// What the agent is told of a failure to `what` (SPEC §12.3): nothing of the relay's paths, bucket or database;
    /// those go to the log.
    private func agentMessage(_ error: any Error, doing what: String) -> String {
        let full = StorageSpace.isDiskFull(error)
        if full { self.context.space.noteFull() }
        self.logger.log(
            level: full ? .warning : .error, "could not \(what) an upload's bytes",
            metadata: ["upload.key": "\(self.key)", "account": "\(self.account.name)", "error": "\(error)"]
        )
        return full
            ? StoreError.fullMessage
            : (error as? StoreError)?.agentMessage ?? "the relay failed to \(what) the bytes; retry later"
    }

    private func syncFailure(_ error: any Error) -> UploadPipeline.SyncFailure {
        UploadPipeline.SyncFailure(description: self.agentMessage(error, doing: "make durable"))
    }

    /// SPEC §6.1: fsync first, then record offset and SHA-1 state; only then acknowledge.
    private func sync(through offset: Int64) async throws -> Int64 {
        if self.stripe != nil {
            // A stripe records nothing before it is complete: its pipeline asks for no sync (an ACK would claim a record).
            throw StoreError("a stripe is made durable only when complete")
        }
        let state = self.sha1.withLockedValue { $0.exportState() }
        // A store that keeps bytes in parts may hold them all back: the record (and its SHA-1 state) stays as it was,
        // and the offset returned (0) acknowledges nothing new.
        let parts: [StagedPart]
        do {
            guard case .durable(let newParts) = try await self.staging.sync(through: offset) else { return 0 }
            parts = newParts
        } catch {
            self.context.metrics.failed("store", "sync")
            throw error
        }
        let recordStart = ContinuousClock.now
        do {
            try await self.record(offset: offset, state: state, parts: parts)
        } catch {
            self.context.metrics.failed("catalog", "record_durable")
            throw error
        }
        self.context.metrics.took("catalog", "record_durable", since: recordStart)
        let before = self.durable.withLockedValue { durable in
            defer { durable = max(durable, offset) }
            return durable
        }
        if offset > before { self.context.metrics.durableBytes.increment(by: offset - before) }
        return offset
    }

    /// Records the session's durable offset and SHA-1 state: the whole session the first time.
    private func record(offset: Int64, state: [UInt8], parts: [StagedPart]) async throws {
        let name = self.staging.name
        if self.recorded.withLockedValue({ $0 }), self.recordedName.withLockedValue({ $0 }) == name {
            try await self.context.catalog.updateDurable(sessionID: self.session.id, offset: offset, sha1State: state, parts: parts)
        } else {
            // Its first durable bytes (a session recorded at its OPEN had none, and no parts): the whole session,
            // under the staging's name now.
            var session = self.session
            session.durableOffset = offset
            session.sha1State = state
            session.stagingName = name
            session.updatedAt = Date()
            try await self.context.catalog.putSession(session, parts: parts)
            self.recorded.withLockedValue { $0 = true }
            self.recordedName.withLockedValue { $0 = name }
        }
    }

    /// Checks the SHA-1 of the bytes written against HASH, then commits by the relay's rules with the next group.
    private func commit(_ hash: Frame.Hash, written: Int64) async -> Result<Frame.Result.Status, UploadPolicy.Refusal> {
        self.commitAsked.withLockedValue { $0 = true }
        // Every byte is written: the disk space promised to this upload and not used is free for others now (a striped
        // upload's other stripes were written under their own streams).
        if self.stripe == nil { self.context.space.release(upload: self.session.id) }
        if let stripe = self.stripe {
            do {
                return .success(try await self.completeStripe(stripe.index, bytes: stripe.length))
            } catch {
                return .failure(UploadPolicy.refusal(for: error, doing: "record the stripe", key: self.key, logger: self.logger))
            }
        }
        if self.session.striped {
            do {
                try await self.hashStripes(size: hash.size)
            } catch {
                return .failure(UploadPolicy.refusal(for: error, doing: "verify the stripes", key: self.key, logger: self.logger))
            }
        }
        let actual = SHA1Digest(bytes: self.sha1.withLockedValue { $0.finalize() })
        guard let actual, actual == hash.sha1 else {
            let message = "SHA-1 of the \(written) bytes received is \(actual.map { "\($0)" } ?? "unknown"); HASH says \(hash.sha1)"
            return .failure(UploadPolicy.Refusal(code: .hashMismatch, message: message, keepSession: false))
        }
        let request = UploadPolicy.CommitRequest(
            staging: self.staging, key: self.key, account: self.account, sessionID: self.session.id,
            sessionRecorded: self.recorded.withLockedValue { $0 }, size: Int64(hash.size), sha1: actual, overwrite: self.overwrite,
            probeSHA1: self.probeDigest(size: hash.size)
        )
        return await self.context.commits.commit(request)
    }

    /// A PART stream's HASH: its stripe is durable, then recorded complete (SPEC §6.7).
    private func completeStripe(_ index: Int, bytes: Int64) async throws -> Frame.Result.Status {
        try await self.staging.sync()
        try await self.context.catalog.completeStripe(sessionID: self.session.id, index: index, bytes: bytes)
        return .stored
    }

    /// The main stream of a striped upload sent stripe 0 and HASH: every other stripe must be complete; their bytes,
    /// read back from the staging file, go into the SHA-1 after stripe 0's (SPEC §6.7, §4.6).
    private func hashStripes(size: UInt64) async throws {
        let stripes = Frame.Stripes(size: size)
        let complete = try await self.context.catalog.completeStripes(sessionID: self.session.id)
        let missing = (1..<stripes.count).filter { !complete.contains($0) }
        guard missing.isEmpty else {
            let list = missing.prefix(8).map(String.init).joined(separator: ", ") + (missing.count > 8 ? ", ..." : "")
            throw UploadPolicy.Refusal(
                code: .sizeMismatch, message: "HASH before every stripe is complete: stripes \(list) of \(stripes.count) are not",
                keepSession: true
            )
        }
        var sha1 = self.sha1.withLockedValue { $0 }
        var offset = stripes.start(of: 1)
        while offset < size {
            let want = Int(min(UInt64(Self.readBackBytes), size - offset))
            let bytes = try await self.staging.read(want, at: Int64(offset))
            guard bytes.readableBytes == want else {
                let end = offset + UInt64(bytes.readableBytes)
                throw StoreError("staging file \(self.staging.name) ends at \(end), before the blob's \(size) bytes")
            }
            bytes.withUnsafeReadableBytes { self.hash($0, into: &sha1) }
            offset += UInt64(want)
        }
        self.sha1.withLockedValue { $0 = sha1 }
    }

    /// The bytes read back at a time to hash a striped upload's stripes.
    static let readBackBytes = 1 << 20

    /// Closes the staging file and forgets the session when asked; the session gives the upload slot and the key back
    /// when it hears this step is done (``RelaySession/StorageCompletion/released``).
    ///
    /// The key stays claimed until the session is gone, so a new OPEN of the same key (waiting meanwhile) can never
    /// resume a session this upload just discarded.
    private func release(discardSession: Bool) async {
        defer {
            // A PART stream shares its main stream's session: the promise is the main stream's to let go.
            if self.stripe == nil { self.context.space.release(upload: self.session.id) }
        }
        self.staging.close()
        // A stripe never owns the session or the staging file: the main stream's upload does.
        guard self.stripe == nil else { return }
        let recorded = self.recorded.withLockedValue { $0 }
        // A session never recorded holds nothing durable: its staging file goes whatever the ending. Nor does one
        // recorded at its OPEN that nothing was made durable for (an OPEN and a dropped connection leave nothing until
        // the expiry); a striped one's stripes may be, by other streams.
        let nothingDurable = self.durable.withLockedValue { $0 } == 0 && !self.session.striped && !self.commitAsked.withLockedValue { $0 }
        guard discardSession || !recorded || nothingDurable else { return }
        do {
            if recorded { try await self.context.catalog.deleteSession(id: self.session.id) }
            try await self.context.store.removeStaging(self.staging.name)
        } catch {
            self.logger.warning("cleanup failed", metadata: ["upload.key": "\(self.key)", "error": "\(error)"])
        }
    }
}
