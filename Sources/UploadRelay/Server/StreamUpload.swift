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
    /// What the upload reports back to its connection handler.
    enum Event {
        /// Storage consumed `bytes` of chunks: return credit.
        case consumed(Int)
        /// Bytes below `offset` are durable: acknowledge.
        case durable(UInt64)
        /// The blob is committed.
        case committed(Frame.Result)
        /// The upload failed on this stream; `discardSession` when its staged bytes are worthless.
        case failed(WireErrorCode, String, discardSession: Bool)
    }

    let id: StreamID
    let key: ObjectKey
    let account: Account
    let open: Frame.Open
    private let services: RelayServices
    private let eventLoop: any EventLoop
    private let onEvent: (Event) -> Void
    private let logger: Logger

    private var session: UploadSession
    private let staging: any StagingFile
    private var sha1: SHA1
    /// Bytes handed to the staging file.
    private var written: Int64
    /// Bytes fsynced and recorded in the catalog.
    private var durable: Int64
    /// Bytes received but not yet handed to storage.
    private var queued: [Frame.Chunk] = []
    private var queuedBytes: Int64 = 0
    private var busy = false
    private var syncRequested = false
    private var syncTimer: Scheduled<Void>? = nil
    private var pendingHash: Frame.Hash? = nil
    private var finished = false
    /// The most bytes the account's quota lets this upload hold, when its size was not announced.
    private let byteLimit: Int64?

    init(
        id: StreamID, key: ObjectKey, account: Account, open: Frame.Open, session: UploadSession, staging: any StagingFile,
        sha1: SHA1, services: RelayServices, eventLoop: any EventLoop, logger: Logger, onEvent: @escaping (Event) -> Void
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
        self.services = services
        self.eventLoop = eventLoop
        self.logger = logger
        self.onEvent = onEvent
        if open.size == nil {
            let quotaLeft = account.quota.map { $0 - account.usedBytes } ?? Int64.max
            self.byteLimit = min(quotaLeft, services.configuration.maxBlobSize)
        } else {
            self.byteLimit = nil
        }
    }

    /// The most chunk bytes written in one trip to the thread pool.
    static let batchBytes = 2 << 20

    /// Whether every received byte is durable and no work is in flight.
    var isQuiet: Bool { !self.busy && self.queued.isEmpty && self.written == self.durable }

    // MARK: Input from the connection

    /// A chunk the state machine accepted (in order, within credit).
    func enqueue(_ chunk: Frame.Chunk) {
        guard !self.finished else { return }
        self.queued.append(chunk)
        self.queuedBytes += Int64(chunk.payloadLength)
        if let limit = self.byteLimit, self.written + self.queuedBytes > limit {
            let quota = limit < self.services.configuration.maxBlobSize
            self.fail(
                quota ? .quotaExceeded : .tooLarge,
                quota
                    ? "account \"\(self.account.name)\" would exceed its quota at \(self.written + self.queuedBytes) bytes"
                    : "blob passes this relay's limit of \(limit) bytes",
                discardSession: true
            )
            return
        }
        self.kick()
    }

    /// HASH arrived: commit once everything before it is stored.
    func finish(_ hash: Frame.Hash) {
        guard !self.finished else { return }
        self.pendingHash = hash
        self.kick()
    }

    /// Makes everything written durable and acknowledged soon (graceful shutdown).
    func requestSync() {
        guard !self.finished, self.written > self.durable || !self.queued.isEmpty else { return }
        self.syncRequested = true
        self.kick()
    }

    /// The stream closed (reset, cancel, connection gone): stop, and drop the session when asked.
    func abort(discardSession: Bool) {
        guard !self.finished else { return }
        self.finished = true
        self.syncTimer?.cancel()
        self.queued.removeAll()
        if !self.busy {
            self.release(discardSession: discardSession)
        } else {
            // The work in flight releases when it returns.
            self.discardOnRelease = discardSession
        }
    }

    private var discardOnRelease = false
    private var released = false

    // MARK: The work queue

    private func kick() {
        guard !self.busy, !self.finished else {
            if self.finished && !self.busy { self.release(discardSession: self.discardOnRelease) }
            return
        }
        if !self.queued.isEmpty {
            self.runWrite()
        } else if self.syncRequested || self.pendingHash != nil && self.written > self.durable {
            self.runSync()
        } else if let hash = self.pendingHash {
            self.runCommit(hash)
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
                    if !self.finished { self.onEvent(.consumed(count)) }
                }
                if let error, !self.finished {
                    // A bad chunk is never written; the durable prefix stays good for a resume (SPEC §8.1).
                    self.fail(error.code, error.message, discardSession: false)
                    return
                }
            case .failure(let error):
                self.fail(.internalError, "storage work failed: \(error)", discardSession: false)
                return
            }
            self.scheduleSyncIfNeeded()
            self.kick()
        }
    }

    private func scheduleSyncIfNeeded() {
        guard !self.finished, self.written > self.durable else { return }
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
        guard self.written > self.durable else {
            self.kick()
            return
        }
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
                if !self.finished { self.onEvent(.durable(UInt64(offset))) }
                self.kick()
            case .failure(let error):
                self.fail(.storageError, "cannot make bytes durable: \(error)", discardSession: false)
            }
        }
    }

    private func runCommit(_ hash: Frame.Hash) {
        self.busy = true
        let actual = SHA1Digest(bytes: self.sha1.finalize())!
        guard actual == hash.sha1 else {
            self.busy = false
            self.fail(
                .hashMismatch, "SHA-1 of the \(self.written) bytes received is \(actual); HASH says \(hash.sha1)",
                discardSession: true
            )
            return
        }
        let services = self.services
        let staging = self.staging
        let key = self.key
        let account = self.account.name
        let sessionID = self.session.id
        let overwrite = self.open.overwrite
        let size = Int64(hash.size)
        self.services.threadPool.runIfActive(eventLoop: self.eventLoop) { () -> Frame.Result.Status in
            let existing = try services.catalog.object(account: account, key: key.value)
            if let existing, existing.sha1 == actual.hex, existing.size == size, try services.store.size(of: key) == size {
                try services.catalog.deleteSession(id: sessionID)
                try services.store.removeStaging(staging.name)
                return .unchanged
            }
            if existing != nil && !overwrite {
                throw CommitRefusal(code: .alreadyExists, message: "key \"\(key)\" holds other content; ask to overwrite (--overwrite) or choose another key")
            }
            if let quota = try services.catalog.account(named: account), !quota.fits(size - (existing?.size ?? 0)) {
                throw CommitRefusal(code: .quotaExceeded, message: "account \"\(account)\" would exceed its quota with \(size) more bytes")
            }
            try services.store.commit(staging, as: key)
            try services.catalog.commitObject(StoredObject(account: account, key: key.value, size: size, sha1: actual.hex), sessionID: sessionID)
            return .stored
        }.assumeIsolated().whenComplete { result in
            self.busy = false
            switch result {
            case .success(let status):
                self.finished = true
                self.release(discardSession: false)
                self.onEvent(.committed(Frame.Result(streamID: self.id, status: status, size: hash.size, sha1: actual, key: key.value)))
            case .failure(let refusal as CommitRefusal):
                self.fail(refusal.code, refusal.message, discardSession: true)
            case .failure(let error as CatalogError):
                self.fail(.quotaExceeded, error.description, discardSession: true)
            case .failure(let error as StoreError):
                self.fail(.storageError, error.description, discardSession: false)
            case .failure(let error):
                self.fail(.internalError, "commit failed: \(error)", discardSession: false)
            }
        }
    }

    private struct CommitRefusal: Error {
        var code: WireErrorCode
        var message: String
    }

    private func fail(_ code: WireErrorCode, _ message: String, discardSession: Bool) {
        guard !self.finished else { return }
        self.logger.info(
            "upload failed", metadata: ["stream.id": "\(self.id)", "upload.key": "\(self.key)", "error.code": "\(code.name)", "error.message": "\(message)"]
        )
        self.finished = true
        self.syncTimer?.cancel()
        self.queued.removeAll()
        self.onEvent(.failed(code, message, discardSession: discardSession))
        if !self.busy { self.release(discardSession: discardSession) } else { self.discardOnRelease = discardSession }
    }

    /// Closes the staging file, forgets the session when asked, then gives the key back.
    ///
    /// The key stays claimed until the session is gone, so a new OPEN of the same key (answered KEY_BUSY meanwhile)
    /// can never resume a session this upload just discarded.
    private func release(discardSession: Bool) {
        guard !self.released else { return }
        self.released = true
        let staging = self.staging
        let services = self.services
        let sessionID = self.session.id
        let account = self.account.name
        let key = self.key
        let logger = self.logger
        services.threadPool.runIfActive(eventLoop: self.eventLoop) {
            staging.close()
            if discardSession {
                try services.catalog.deleteSession(id: sessionID)
                try services.store.removeStaging(staging.name)
            }
        }.whenComplete { result in
            services.release(account: account, key: key.value)
            if case .failure(let error) = result {
                logger.warning("cleanup failed", metadata: ["upload.key": "\(key)", "error": "\(error)"])
            }
        }
    }
}
