import NIOConcurrencyHelpers
import UploadChecksums
import UploadProtocol

/// One item's state across connections: what a reconnect needs to resume it.
///
/// Touched by one connection's event loop at a time (the queue hands a job to one connection),
/// so its fields need no lock of their own.
final class UploadJob: @unchecked Sendable {
    let item: UploadItem
    /// The item's row in the agent's state database, when the run keeps one.
    let queueID: Int64?
    /// What the state database held for the item when this run took it: the relay's durable offset and the agent's
    /// SHA-1 state there, valid while the source's fingerprint is unchanged.
    var recorded: (fingerprint: [UInt8], offset: UInt64, state: SHA1)? = nil
    var info: SourceInfo? = nil
    /// The blob's SHA-1 when hashed before OPEN (dedup), or once the upload completed.
    var knownSHA1: SHA1Digest? = nil
    /// The relay answered a probe with CONFIRM (SPEC §7.1): the next OPEN carries the whole SHA-1.
    var probeConfirmed = false
    /// The SHA-1 of the first 256 KiB, when it was opened with the dedup probe.
    var probe: SHA1Digest? = nil
    /// The running SHA-1 after those 256 KiB: an upload from offset 0 hashes on from there, not again from the start.
    var probePrefix: SHA1? = nil

    /// What says, before a byte is sent, that two jobs hold the same bytes: their SHA-1, or their size and probe.
    struct ContentKey: Hashable {
        var sha1: SHA1Digest?
        var probe: SHA1Digest?
        var size: UInt64?
    }

    var contentKey: ContentKey? {
        if let sha1 = self.knownSHA1 { return ContentKey(sha1: sha1) }
        if let probe = self.probe { return ContentKey(probe: probe, size: self.info?.size) }
        return nil
    }
    /// The relay's resume token from the last OFFSET.
    var resumeToken: [UInt8] = []
    /// Payload bytes sent over every connection of this run.
    var sentBytes: UInt64 = 0
    /// CHUNK data bytes as they went on the wire: deflated where deflate shrank them (frame headers and TLS not counted).
    var wireBytes: UInt64 = 0
    /// Bytes read only to hash them: a dedup hash before OPEN, a prefix before a resume.
    var hashedBytes: UInt64 = 0
    /// The size the source turned out to have, set when HASH goes out (the result's size for sources of unknown size).
    var bytesRead: UInt64 = 0
    /// The relay's durable offset.
    var acked: UInt64 = 0
    /// SHA-1 states at chunk boundaries not yet acknowledged, so a resume at any ACK needs no re-read.
    var snapshots: [UInt64: SHA1] = [:]
    /// Stream errors so far that allow a retry.
    var attempts = 0
    /// Since when the relay has answered "not now" (KEY_BUSY, REFUSED_STREAM) without starting the upload.
    var busySince: ContinuousClock.Instant? = nil
    /// How many "not now" answers in a row: the wait before the next try grows with it.
    var busyRetries = 0
    var lastError: String? = nil
    var result: UploadResult? = nil

    init(item: UploadItem, queueID: Int64? = nil) {
        self.item = item
        self.queueID = queueID
    }

    var key: String { self.item.key }

    /// Forgets SHA-1 snapshots below the durable offset: a resume never starts there.
    func acknowledge(_ offset: UInt64) {
        guard offset > self.acked else { return }
        self.acked = offset
        self.snapshots = self.snapshots.filter { $0.key >= offset }
        self.item.source.acknowledge(upTo: offset)
    }

    func finish(_ status: UploadResult.Status, sha1: String, error: String? = nil) -> UploadResult {
        let result = UploadResult(
            key: self.key, path: self.item.displayPath, bytes: self.info?.size ?? self.bytesRead, sha1: sha1, status: status,
            sentBytes: self.sentBytes, hashedBytes: self.hashedBytes, wireBytes: self.wireBytes, error: error
        )
        self.result = result
        self.item.source.close()
        return result
    }
}
