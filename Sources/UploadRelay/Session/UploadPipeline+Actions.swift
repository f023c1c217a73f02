import UploadProtocol

/// What a pipeline decides with (its settings) and what it decides (its actions and events).
extension UploadPipeline {
    /// What the upload reports to its connection, only while its stream is open.
    package enum Event: Hashable {
        /// Storage consumed `bytes` of chunks: return credit.
        case consumed(Int)
        /// Bytes below `offset` are durable: acknowledge.
        case durable(UInt64)
        /// The blob is committed.
        case committed(Frame.Result)
        /// The upload failed on this stream (the pipeline has ended itself; write the ERROR).
        case failed(WireErrorCode, String)
    }

    /// Work for storage, off the event loop, one at a time per upload: each reports how it ended to the session
    /// (``RelaySession/StorageCompletion``).
    package enum StorageStep: Hashable {
        /// Verify these chunks and write their raw bytes to the staging file from `offset` on; then call
        /// ``writeFinished(consumed:error:)``.
        case write([Frame.Chunk], at: Int64)
        /// Sync the staging file and record the offset `through` with the SHA-1 state there; then call
        /// ``syncFinished(_:)``.
        case sync(through: Int64)
        /// Check the SHA-1 of the `written` bytes received against `hash`, then commit; then call ``commitFinished(_:)``.
        case commit(Frame.Hash, written: Int64)
        /// Close the staging file, dropping the session and its bytes when asked; the session then gives the upload
        /// slot and the key back.
        case release(discardSession: Bool)
    }

    /// What the pipeline decides: a storage step, or the session's own bookkeeping.
    package enum Action: Hashable {
        case storage(StorageStep)
        /// Call ``syncTimerFired()`` after the sync interval.
        case armSyncTimer
        case cancelSyncTimer
        /// The stream has ended on the wire: a new OPEN of the key waits for this upload instead of KEY_BUSY.
        case markClosing
        /// Give the upload slot and the key back at once (the commit already forgot the session), and the storage up.
        case releaseCommitted
        case report(Event)
    }

    /// Why a sync failed, for people.
    package struct SyncFailure: Error, Hashable {
        var description: String
    }

    /// Limits and names the pipeline decides with.
    struct Settings: Hashable {
        var streamID: StreamID
        var key: String
        var account: String
        /// The most bytes this upload may hold, when its size was not announced (quota left, largest blob).
        var byteLimit: Int64?
        /// The relay's largest blob: a byte limit below it is the account's quota.
        var maxBlobSize: Int64
        /// Bytes written but not durable that make a sync due at once.
        var syncBytes: Int64
        /// The most chunk bytes written by one storage step.
        var batchBytes: Int = 2 << 20
        /// Whether bytes are made durable (and acknowledged) as they arrive. A PART stream's stripe is not: it is made
        /// durable and recorded once complete, and sent again whole if its stream ends before (SPEC §6.7).
        var syncs: Bool = true
    }
}
