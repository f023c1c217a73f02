import Foundation
import Logging
import NIOCore
import UploadChecksums
import UploadProtocol

/// One upload in progress on a relay connection: its staging file, its running SHA-1, and the
/// serial queue of storage work (write, make durable, commit) done on the I/O thread pool.
///
/// Lives on the connection's event loop. Work for one stream runs one piece at a time, in order,
/// so the SHA-1 state and the staging file are never touched by two threads at once.
final class StreamUpload {
    /// What the upload reports back to its connection handler, only while its stream is open.
    enum Event {
        /// Storage consumed `bytes` of chunks: return credit.
        case consumed(Int)
        /// Bytes below `offset` are durable: acknowledge.
        case durable(UInt64)
        /// The blob is committed.
        case committed(Frame.Result)
        /// The upload failed on this stream (the upload has closed itself; write the ERROR).
        case failed(WireErrorCode, String)
    }

    private enum Phase {
        /// The stream is open: events flow to the handler.
        case open
        /// The stream has ended on the wire. With `keep`, the bytes received are still written and made durable
        /// (so that a resume re-sends nothing the relay already took, issue 6 finding 20), then the upload is
        /// released; without, the session and its staged bytes are dropped.
        case ending(keep: Bool)
        /// Staging file closed, key given back (or being given back).
        case released
    }

    let id: StreamID
    let key: ObjectKey
    let account: Account
    let open: Frame.Open
    private let services: RelayServices
    private let eventLoop: any EventLoop
    private let onEvent: (Event) -> Void
    private let logger: Logger

    private let session: UploadSession
    private let staging: any StagingFile
    private var sha1: SHA1
    /// Bytes handed to the staging file.
    private var written: Int64
    /// Bytes fsynced and recorded in the catalog.
    private var durable: Int64
    /// Bytes received but not yet handed to storage.
    private var queued: [Frame.Chunk] = []
    private var queuedBytes: Int64 = 0
    /// Storage work is under way on the thread pool.
    private var busy = false
    private var syncRequested = false
    private var syncTimer: Scheduled<Void>? = nil
    private var pendingHash: Frame.Hash? = nil
    private var phase = Phase.open
    /// The most bytes this upload may hold, when its size was not announced (quota left, largest blob).
    private let byteLimit: Int64?

    init(
        id: StreamID, key: ObjectKey, account: Account, open: Frame.Open, session: UploadSession, staging: any StagingFile,
        sha1: SHA1, byteLimit: Int64?, services: RelayServices, eventLoop: any EventLoop, logger: Logger,
        onEvent: @escaping (Event) -> Void
    ) {
        self.id = id
        self.key = key
        self.account = account
        self.open = open
        self.session = session
        self.staging = staging
        self.sha1 = sha1
        self.written = session.durableOffset
        self.durable = session.durableOffset
        self.byteLimit = byteLimit
        self.services = services
        self.eventLoop = eventLoop
        self.logger = logger
        self.onEvent = onEvent
    }

    /// The most chunk bytes written in one trip to the thread pool.
    static let batchBytes = 2 << 20

    /// Whether every received byte is durable and no work is in flight.
    var isQuiet: Bool { !self.busy && self.queued.isEmpty && self.written == self.durable }

    /// Whether HASH arrived and the upload is verifying or committing (SPEC §4.4 VERIFYING).
    var isVerifying: Bool { self.pendingHash != nil }

    private var isOpen: Bool {
        if case .open = self.phase { return true }
        return false
    }

    private var claimName: String { KeyClaims.name(account: self.account.name, key: self.key.value) }

    // MARK: Input from the connection

    /// A chunk the state machine accepted (in order, within credit).
    func enqueue(_ chunk: Frame.Chunk) {
        guard self.isOpen else { return }
        self.queued.append(chunk)
        self.queuedBytes += Int64(chunk.payloadLength)
        if let limit = self.byteLimit, self.written + self.queuedBytes > limit {
            let quota = limit < self.services.configuration.maxBlobSize
            self.fail(
                quota ? .quotaExceeded : .tooLarge,
                quota
                    ? "account \"\(self.account.name)\" would exceed its quota at \(self.written + self.queuedBytes) bytes"
                    : "blob passes this relay's limit of \(limit) bytes",
                keep: false
            )
        }
        self.kick()
    }

    /// HASH arrived: commit once everything before it is stored.
    func finish(_ hash: Frame.Hash) {
        guard self.isOpen else { return }
        self.pendingHash = hash
        self.kick()
    }

    /// Makes everything written durable and acknowledged soon (graceful shutdown).
    func requestSync() {
        guard self.isOpen, self.written > self.durable || !self.queued.isEmpty else { return }
        self.syncRequested = true
        self.kick()
    }

    /// The stream ended without a commit (reset by either side, cancelled, connection gone). With `keepSession`
    /// the bytes received so far are written and made durable first, so the agent resumes after them; otherwise the
    /// session and its staged bytes are dropped (CANCEL, or bytes that are worthless).
    func abort(keepSession: Bool) {
        guard self.isOpen else { return }
        self.end(keep: keepSession)
        self.kick()
    }

    /// Leaves the open phase: from here on the key is closing, so a new OPEN of it waits instead of KEY_BUSY.
    private func end(keep: Bool) {
        self.phase = .ending(keep: keep)
        self.services.claims.markClosing(self.claimName)
        self.syncTimer?.cancel()
        self.syncTimer = nil
        self.pendingHash = nil
        if !keep {
            self.queued.removeAll()
            self.queuedBytes = 0
        }
    }

    // MARK: The work queue

    /// Starts the next piece of storage work, if none is under way. Durability comes before more writes, so what
    /// is consumed (and its credit returned) never runs ahead of what is durable by more than the sync batch plus one
    /// write batch (issue 6 finding 23).
    private func kick() {
        guard !self.busy else { return }
        switch self.phase {
        case .released:
            return
        case .open:
            if self.syncRequested && self.written > self.durable {
                self.runSync()
            } else if !self.queued.isEmpty {
                self.runWrite()
            } else if self.syncRequested || (self.pendingHash != nil && self.written > self.durable) {
                self.runSync()
            } else if let hash = self.pendingHash {
                self.runCommit(hash)
            }
        case .ending(let keep):
            if keep && !self.queued.isEmpty {
                self.runWrite()
            } else if keep && self.written > self.durable {
                self.runSync()
            } else {
                self.release(discardSession: !keep)
            }
        }
    }

    private func runWrite() {
        // At most a couple of MiB per trip: storage reports consumption (and credit flows back) sooner.
        var take = 0
        var bytes = 0
        while take < self.queued.count && (take == 0 || bytes + self.queued[take].payloadLength <= Self.batchBytes) {
            bytes += self.queued[take].payloadLength
            take += 1
        }
        let chunks = Array(self.queued.prefix(take))
        self.queued.removeFirst(take)
        self.queuedBytes -= Int64(bytes)
        self.busy = true
        let startSHA1 = self.sha1
        let staging = self.staging
        let startOffset = self.written
        let work = self.services.threadPool.runIfActive(eventLoop: self.eventLoop) { () -> (SHA1, [Int], ProtocolError?) in
            var sha1 = startSHA1
            var offset = startOffset
            var consumed: [Int] = []
            for chunk in chunks {
                switch ChunkVerifier.rawBytes(of: chunk) {
                case .failure(let error):
                    return (sha1, consumed, error)
                case .success(let raw):
                    do {
                        try staging.write(raw, at: offset)
                    } catch {
                        return (sha1, consumed, .stream(chunk.streamID, .storageError, "\(error)"))
                    }
                    raw.withUnsafeReadableBytes { sha1.update($0) }
                    offset += Int64(raw.readableBytes)
                    consumed.append(chunk.payloadLength)
                }
            }
            return (sha1, consumed, nil)
        }
        work.assumeIsolated().whenComplete { result in
            self.busy = false
            switch result {
            case .success(let (sha1, consumed, error)):
                self.sha1 = sha1
                for count in consumed {
                    self.written += Int64(count)
                    if self.isOpen { self.onEvent(.consumed(count)) }
                }
                if let error {
                    // A bad chunk is never written; what came before it is made durable for a resume (SPEC §8.1).
                    self.queued.removeAll()
                    self.queuedBytes = 0
                    self.fail(error.code, error.message, keep: true)
                }
            case .failure(let error):
                self.queued.removeAll()
                self.queuedBytes = 0
                self.fail(.internalError, "storage work failed: \(error)", keep: true)
            }
            self.scheduleSyncIfNeeded()
            self.kick()
        }
    }

    private func scheduleSyncIfNeeded() {
        guard self.isOpen, self.written > self.durable else { return }
        if self.written - self.durable >= Int64(self.services.configuration.syncBytes) {
            self.syncRequested = true
        } else if self.syncTimer == nil {
            self.syncTimer = self.eventLoop.assumeIsolated().scheduleTask(in: TimeAmount(self.services.configuration.syncInterval)) {
                self.syncTimer = nil
                self.syncRequested = true
                self.kick()
            }
        }
    }

    private func runSync() {
        self.syncRequested = false
        self.syncTimer?.cancel()
        self.syncTimer = nil
        self.busy = true
        let offset = self.written
        let state = self.sha1.exportState()
        let staging = self.staging
        let catalog = self.services.catalog
        let sessionID = self.session.id
        self.services.threadPool.runIfActive(eventLoop: self.eventLoop) {
            // SPEC §6.1: fsync first, then record offset and SHA-1 state; only then acknowledge.
            try staging.sync()
            try catalog.updateDurable(sessionID: sessionID, offset: offset, sha1State: state)
        }.assumeIsolated().whenComplete { result in
            self.busy = false
            switch result {
            case .success:
                self.durable = offset
                if self.isOpen { self.onEvent(.durable(UInt64(offset))) }
            case .failure(let error):
                if self.isOpen {
                    self.fail(.storageError, "cannot make bytes durable: \(error)", keep: true)
                }
                // Nothing more can be made durable: let go.
                self.queued.removeAll()
                self.queuedBytes = 0
                self.written = self.durable
            }
            self.kick()
        }
    }

    private func runCommit(_ hash: Frame.Hash) {
        let actual = SHA1Digest(bytes: self.sha1.finalize())!
        guard actual == hash.sha1 else {
            self.fail(
                .hashMismatch, "SHA-1 of the \(self.written) bytes received is \(actual); HASH says \(hash.sha1)", keep: false
            )
            self.kick()
            return
        }
        self.busy = true
        let services = self.services
        let staging = self.staging
        let key = self.key
        let account = self.account.name
        let sessionID = self.session.id
        let overwrite = self.open.overwrite
        let size = Int64(hash.size)
        self.services.threadPool.runIfActive(eventLoop: self.eventLoop) { () -> Frame.Result.Status in
            try Self.commit(
                staging, key: key, account: account, sessionID: sessionID, size: size, sha1: actual, overwrite: overwrite,
                services: services
            )
        }.assumeIsolated().whenComplete { result in
            self.busy = false
            switch result {
            case .success(let status):
                guard self.isOpen else {
                    // CANCEL crossed the commit (SPEC §3.11: the agent assumes neither outcome).
                    self.kick()
                    return
                }
                // The key is closing before RESULT goes out: an OPEN after RESULT waits for it, never KEY_BUSY.
                self.end(keep: false)
                self.phase = .released
                services.uploadSlots.give(1)
                services.claims.release(self.claimName)
                self.onEvent(.committed(Frame.Result(streamID: self.id, status: status, size: hash.size, sha1: actual, key: key.value)))
            case .failure(let refusal as CommitRefusal):
                self.fail(refusal.code, refusal.message, keep: false)
            case .failure(let error as CatalogError):
                self.fail(.quotaExceeded, error.description, keep: false)
            case .failure(let error as StoreError):
                self.fail(.storageError, error.description, keep: true)
            case .failure(let error):
                self.fail(.internalError, "commit failed: \(error)", keep: true)
            }
            self.kick()
        }
    }

    /// Verified bytes become the object (SPEC §8.3): quota reserved in the catalog first, then the store's atomic
    /// rename, then the record. Nothing that will be refused is ever renamed into place.
    private static func commit(
        _ staging: any StagingFile, key: ObjectKey, account: String, sessionID: String, size: Int64, sha1: SHA1Digest,
        overwrite: Bool, services: RelayServices
    ) throws -> Frame.Result.Status {
        let catalog = services.catalog
        let store = services.store
        guard let current = try catalog.account(named: account), !current.revoked else {
            throw CommitRefusal(code: .unauthenticated, message: "the token of account \"\(account)\" was revoked: nothing was stored")
        }
        let existing = try catalog.object(account: account, key: key.value)
        if let verified = try UploadOpener.verifiedObject(existing, services: services), verified.sha1 == sha1.hex, verified.size == size {
            try catalog.deleteSession(id: sessionID)
            try store.removeStaging(staging.name)
            staging.close()
            return .unchanged
        }
        if existing != nil && !overwrite {
            throw CommitRefusal(code: .alreadyExists, message: UploadOpener.alreadyExists(key))
        }
        if let conflict = try store.conflict(for: key, account: account) {
            throw CommitRefusal(code: .invalidKey, message: conflict)
        }
        let pending = PendingCommit(account: account, key: key.value, size: size, sha1: sha1.hex, sessionID: sessionID)
        try catalog.beginCommit(pending)
        let identity: ObjectIdentity
        do {
            identity = try store.commit(staging, as: key, account: account)
        } catch let error as StoreError where error.madeVisible {
            // Visible but unrecorded: the pending commit stays for recovery to settle.
            throw error
        } catch {
            try? catalog.abandonCommit(account: account, key: key.value)
            throw error
        }
        // Should this record fail, startup recovery finds the pending commit and the object, and settles it.
        try catalog.finishCommit(pending, identity: identity)
        return .stored
    }

    private struct CommitRefusal: Error {
        var code: WireErrorCode
        var message: String
    }

    /// The relay fails the stream: it ends here (so the key is closing before the ERROR goes out), then the handler
    /// writes the ERROR.
    private func fail(_ code: WireErrorCode, _ message: String, keep: Bool) {
        guard self.isOpen else { return }
        self.logger.info(
            "upload failed", metadata: ["stream.id": "\(self.id)", "upload.key": "\(self.key)", "error.code": "\(code.name)", "error.message": "\(message)"]
        )
        self.end(keep: keep)
        self.onEvent(.failed(code, message))
    }

    /// Closes the staging file, forgets the session when asked, then gives the key back.
    ///
    /// The key stays claimed until the session is gone, so a new OPEN of the same key (waiting meanwhile) can never
    /// resume a session this upload just discarded.
    private func release(discardSession: Bool) {
        self.phase = .released
        let staging = self.staging
        let services = self.services
        let sessionID = self.session.id
        let claim = self.claimName
        let key = self.key
        let logger = self.logger
        services.threadPool.runIfActive(eventLoop: self.eventLoop) {
            staging.close()
            if discardSession {
                try services.catalog.deleteSession(id: sessionID)
                try services.store.removeStaging(staging.name)
            }
        }.whenComplete { result in
            services.uploadSlots.give(1)
            services.claims.release(claim)
            if case .failure(let error) = result {
                logger.warning("cleanup failed", metadata: ["upload.key": "\(key)", "error": "\(error)"])
            }
        }
    }
}
