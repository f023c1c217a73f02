import NIOCore
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
    /// The SHA-1 of a HASH the relay answered with an error or never answered, and the fingerprint of the source it
    /// was read from: the commit may have taken effect. The next OPEN of the same source states that SHA-1, so the
    /// relay answers STORED if it did (the session is gone then: a resume token alone would start over from 0), and
    /// STORED is then this upload's, not a copy that was there.
    var undecided: (sha1: SHA1Digest, fingerprint: [UInt8])? = nil

    /// Notes that the relay was sent `sha1` in a HASH whose answer was an error or lost.
    func hashUndecided(_ sha1: SHA1Digest?) {
        guard self.stripe == nil, let sha1, let fingerprint = self.info?.fingerprint, !fingerprint.isEmpty else { return }
        self.undecided = (sha1, fingerprint)
    }
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

    /// Every key its content is known by: a job opened with a probe learns its SHA-1 as it goes, and a twin parked under
    /// the probe must still find it.
    var contentKeys: [ContentKey] {
        var keys: [ContentKey] = []
        if let sha1 = self.knownSHA1 { keys.append(ContentKey(sha1: sha1)) }
        if let probe = self.probe { keys.append(ContentKey(probe: probe, size: self.info?.size)) }
        return keys
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
    /// The whole source, kept from its hash before OPEN (small sources, ``AgentConfiguration/heldSourceBytes``): sent
    /// from here. Let go when the job ends.
    var heldContent: ByteBuffer? = nil
    /// Stream errors so far that allow a retry.
    var attempts = 0
    /// Since when the relay has answered "not now" (KEY_BUSY, REFUSED_STREAM) without starting the upload.
    var busySince: ContinuousClock.Instant? = nil
    /// How many "not now" answers in a row: the wait before the next try grows with it.
    var busyRetries = 0
    /// How many times the relay had no room for it (QUOTA_EXCEEDED, storage full), and since when: each wait is longer.
    var noRoomRetries = 0
    var noRoomSince: ContinuousClock.Instant? = nil
    var lastError: String? = nil
    /// The relay's last error on this job's stream, for the result of a stream source that cannot follow a retry.
    var lastRefusal: (code: WireErrorCode, message: String)? = nil
    var result: UploadResult? = nil

    /// For a PART job (SPEC §6.7): the main job whose upload it belongs to, the stripe it sends, and the stripes' state
    /// it was made for (a main stream that started over makes a new one, and the old PART jobs are dropped).
    let stripe: (main: UploadJob, index: Int, set: StripeSet)?
    /// The job's OPEN was STRIPED: it sends stripe 0, PART jobs send the others.
    var striped = false
    /// The stripes of the striped upload this job opened, once the relay named it (its resume token).
    var stripes: StripeSet? = nil

    init(item: UploadItem, queueID: Int64? = nil) {
        self.item = item
        self.queueID = queueID
        self.stripe = nil
    }

    /// A PART job: stripe `index` of `main`'s striped upload, whose resume token `set` holds.
    init(stripe index: Int, of main: UploadJob, set: StripeSet) {
        self.item = main.item
        self.queueID = nil
        self.stripe = (main, index, set)
        self.info = main.info
        self.resumeToken = set.token
    }

    var key: String { self.item.key }

    /// Forgets SHA-1 snapshots below the durable offset: a resume never starts there.
    func acknowledge(_ offset: UInt64) {
        guard offset > self.acked else { return }
        self.acked = offset
        self.snapshots = self.snapshots.filter { $0.key >= offset }
        self.item.source.acknowledge(upTo: offset)
    }

    /// The bytes this job's stream carries (SPEC §6.7): its stripe for a PART job, stripe 0 for a striped one, else the
    /// whole source (nil when its size is unknown).
    var streamLength: UInt64? {
        guard let size = self.info?.size else { return nil }
        if let stripe = self.stripe { return stripe.set.stripes.length(of: stripe.index) }
        return self.striped ? Frame.Stripes(size: size).length(of: 0) : size
    }

    func finish(_ status: UploadResult.Status, sha1: String, error: String? = nil, code: String? = nil) -> UploadResult {
        self.heldContent = nil
        var result = UploadResult(
            key: self.key, path: self.item.displayPath, bytes: self.info?.size ?? self.bytesRead, sha1: sha1, status: status,
            sentBytes: self.sentBytes, hashedBytes: self.hashedBytes, wireBytes: self.wireBytes, error: error
        )
        if error != nil { result.errorCode = code ?? UploadResult.ErrorCode.failed }
        if self.striped, let stripes = self.stripes { result.stripes = stripes.stripes.count }
        self.result = result
        // A PART job shares its main job's source.
        if self.stripe == nil { self.item.source.close() }
        return result
    }
}
