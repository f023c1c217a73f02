import Foundation
import Logging
import NIOCore
import UploadChecksums
import UploadPayload
import UploadProtocol

/// Runs the storage steps of one upload on the I/O thread pool (write, sync, commit, release) and reports how each
/// ended. It decides nothing: the steps come from the upload's ``UploadPipeline`` through the ``RelaySession``.
///
/// Lives on the connection's event loop. The pipeline starts one step at a time, so the SHA-1 state and the staging
/// file are never touched by two threads at once.
final class UploadExecutor {
    let id: StreamID
    private let key: ObjectKey
    private let account: String
    private let overwrite: Bool
    private let claim: String
    private let services: RelayServices
    private let eventLoop: any EventLoop
    private let logger: Logger
    private let session: UploadSession
    private let staging: any StagingFile
    /// The SHA-1 of the bytes written so far.
    private var sha1: SHA1
    /// Where each step's completion goes (the connection's session, through its handler).
    var onCompletion: (RelaySession.StorageCompletion) -> Void = { _ in }

    init(
        id: StreamID, key: ObjectKey, account: String, overwrite: Bool, session: UploadSession, staging: any StagingFile,
        sha1: SHA1, services: RelayServices, eventLoop: any EventLoop, logger: Logger
    ) {
        self.id = id
        self.key = key
        self.account = account
        self.overwrite = overwrite
        self.claim = KeyClaims.name(account: account, key: key.value)
        self.session = session
        self.staging = staging
        self.sha1 = sha1
        self.services = services
        self.eventLoop = eventLoop
        self.logger = logger
    }

    func run(_ step: UploadPipeline.Action) {
        switch step {
        case .write(let chunks, let offset): self.write(chunks, at: offset)
        case .sync(let offset): self.sync(through: offset)
        case .commit(let hash, let written): self.commit(hash, written: written)
        case .release(let discardSession): self.release(discardSession: discardSession)
        case .releaseCommitted:
            // The commit closed the staging file and forgot the session; the session gave the slot and key back.
            self.onCompletion = { _ in }
        case .armSyncTimer, .cancelSyncTimer, .markClosing, .report: break
        }
    }

    /// Opens each chunk (inflate, CRC-32), writes its raw bytes, and hashes them.
    private func write(_ chunks: [Frame.Chunk], at startOffset: Int64) {
        let startSHA1 = self.sha1
        let staging = self.staging
        let work = self.services.threadPool.runIfActive(eventLoop: self.eventLoop) { () -> (SHA1, [Int], ProtocolError?) in
            var sha1 = startSHA1
            var offset = startOffset
            var consumed: [Int] = []
            for chunk in chunks {
                switch ChunkPayload.open(chunk) {
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
            switch result {
            case .success(let (sha1, consumed, error)):
                self.sha1 = sha1
                self.onCompletion(.wrote(consumed: consumed, error: error.map { ($0.code, $0.message) }))
            case .failure(let error):
                self.onCompletion(.wrote(consumed: [], error: (.internalError, "storage work failed: \(error)")))
            }
        }
    }

    /// SPEC §6.1: fsync first, then record offset and SHA-1 state; only then acknowledge.
    private func sync(through offset: Int64) {
        let state = self.sha1.exportState()
        let staging = self.staging
        let catalog = self.services.catalog
        let sessionID = self.session.id
        self.services.threadPool.runIfActive(eventLoop: self.eventLoop) {
            try staging.sync()
            try catalog.updateDurable(sessionID: sessionID, offset: offset, sha1State: state)
        }.assumeIsolated().whenComplete { result in
            self.onCompletion(.synced(result.map { offset }.mapError { UploadPipeline.SyncFailure(description: "\($0)") }))
        }
    }

    /// Checks the SHA-1 of the bytes written against HASH, then commits by the relay's rules.
    private func commit(_ hash: Frame.Hash, written: Int64) {
        let actual = SHA1Digest(bytes: self.sha1.finalize())!
        guard actual == hash.sha1 else {
            let message = "SHA-1 of the \(written) bytes received is \(actual); HASH says \(hash.sha1)"
            self.onCompletion(.committed(.failure(UploadPolicy.Refusal(code: .hashMismatch, message: message, keepSession: false))))
            return
        }
        let policy = UploadPolicy(services: self.services)
        let (staging, key, account, sessionID, overwrite) = (self.staging, self.key, self.account, self.session.id, self.overwrite)
        let size = Int64(hash.size)
        self.services.threadPool.runIfActive(eventLoop: self.eventLoop) { () -> Frame.Result.Status in
            try policy.commit(staging, key: key, account: account, sessionID: sessionID, size: size, sha1: actual, overwrite: overwrite)
        }.assumeIsolated().whenComplete { result in
            self.onCompletion(.committed(result.mapError { UploadPolicy.refusal(for: $0, doing: "commit") }))
        }
    }

    /// Closes the staging file, forgets the session when asked, then gives the upload slot and the key back.
    ///
    /// The key stays claimed until the session is gone, so a new OPEN of the same key (waiting meanwhile) can never
    /// resume a session this upload just discarded.
    private func release(discardSession: Bool) {
        self.onCompletion = { _ in }
        let (staging, services, sessionID, claim, key, logger) = (self.staging, self.services, self.session.id, self.claim, self.key, self.logger)
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
