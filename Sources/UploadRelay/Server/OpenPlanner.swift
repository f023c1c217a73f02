import UploadChecksums
import UploadProtocol

/// What the relay knows about an OPEN's key when it decides (SPEC §6.2, §7, §7.1), read from the catalog and the store
/// in one pass by ``UploadPolicy``, after the key is claimed and any commit of it left undecided is settled.
struct OpenFacts: Sendable {
    /// The relay's largest blob.
    var maxBlobSize: Int64
    /// A new upload no longer than this is recorded by its first durable sync, a longer one at OPEN.
    var syncBytes: Int
    /// Why the store cannot hold the key (a file where a directory must go), if it cannot.
    var conflict: String? = nil
    /// The key's object, if it has one.
    var existing: StoredObject? = nil
    /// Whether the store's file of ``existing`` is still the one the relay committed (read when OPEN states a SHA-1).
    var existingVerified = false
    /// Objects of other keys of the account recorded with OPEN's size and SHA-1 (read when OPEN states a SHA-1): a copy
    /// of one can be linked under the key, once its file is verified still the committed one (when it is linked).
    var twins: [StoredObject] = []
    /// With PROBE: whether a verified object of the account may hold these bytes.
    var probeMatched = false
    /// The key's unfinished upload, if any.
    var session: UploadSession? = nil
    /// Whether ``session``'s SHA-1 state is usable: it covers exactly its durable bytes.
    var sessionHashUsable = false
}

/// What OPEN comes to, decided by ``OpenPlanner/plan(_:key:_:)`` from ``OpenFacts`` alone.
enum OpenPlan: Equatable, Sendable {
    /// OFFSET STORED: the key holds these bytes.
    case stored(size: UInt64)
    /// ERROR on the stream.
    case refuse(WireErrorCode, String)
    /// Link a copy of one of these objects under the key (each tried in order, SPEC §7); when none can be linked, plan
    /// again without them.
    case duplicate([StoredObject])
    /// OFFSET CONFIRM: a PROBE matched (SPEC §7.1).
    case confirm
    /// An upload, admitted against the quota first.
    case upload(OpenUpload)
}

/// The upload an OPEN starts or resumes.
struct OpenUpload: Equatable, Sendable {
    /// When the catalog records a new upload's session.
    enum Record: Equatable {
        /// At its first durable sync: an upload committed at once never writes one (a photo costs no catalog write
        /// before its commit).
        case atFirstSync
        /// At OPEN: longer than one sync, or a stream, it shows as uploading with 0 bytes from its OPEN.
        case atOpen
        /// At OPEN, striped: PART streams on other connections look it up by its token before stripe 0 syncs (SPEC §6.7).
        case striped
    }

    /// What committing it would add to the account's stored bytes (negative when it replaces a larger object).
    var growth: Int64
    /// The size of the object it would replace (0 when none).
    var replacing: Int64
    /// The unfinished upload to resume, if its staging still holds its durable bytes.
    var resume: UploadSession?
    /// The unfinished upload to drop first (another version of the source, or a session that cannot be trusted).
    var discard: UploadSession?
    /// How a new upload is recorded.
    var record: Record
}

/// OPEN's decision, pure: no catalog, no store, no clock (SPEC §6, §7).
enum OpenPlanner {
    static func plan(_ open: Frame.Open, key: ObjectKey, _ facts: OpenFacts) -> OpenPlan {
        let size = open.size.map { Int64($0) }
        if let size, size > facts.maxBlobSize {
            return .refuse(.tooLarge, "\(size) bytes is larger than this relay's limit of \(facts.maxBlobSize)")
        }
        if let conflict = facts.conflict {
            return .refuse(.invalidKey, conflict)
        }
        if let sha1 = open.sha1, let size {
            if facts.existingVerified, let existing = facts.existing, existing.size == size, existing.sha1 == sha1.hex {
                return .stored(size: UInt64(size))
            }
            if facts.existing != nil && !open.overwrite {
                return .refuse(.alreadyExists, UploadPolicy.alreadyExists(key))
            }
            // Dedup within the account: the bytes are here already, verified by this relay.
            if !facts.twins.isEmpty {
                return .duplicate(facts.twins)
            }
        }
        if open.probe != nil, size != nil {
            if facts.probeMatched {
                return .confirm
            }
            if facts.existing != nil && !open.overwrite {
                return .refuse(.alreadyExists, UploadPolicy.alreadyExists(key))
            }
        }
        let replacing = facts.existing?.size ?? 0
        var upload = OpenUpload(growth: (size ?? 0) - replacing, replacing: replacing, resume: nil, discard: nil, record: .atOpen)
        if let session = facts.session {
            if facts.sessionHashUsable && Self.resumes(open, session) {
                upload.resume = session
            } else {
                upload.discard = session
            }
        }
        if open.striped && size != nil {
            upload.record = .striped
        } else if let size, size <= Int64(facts.syncBytes) {
            upload.record = .atFirstSync
        }
        return .upload(upload)
    }

    /// Whether `open` resumes `session`, found under its key (SPEC §6.2): named by its resume token or fingerprint, of
    /// the same source, size, SHA-1 (when both state one) and striping.
    static func resumes(_ open: Frame.Open, _ session: UploadSession) -> Bool {
        let size = open.size.map { Int64($0) }
        let byToken = !open.resumeToken.isEmpty && open.resumeToken == session.resumeToken
        let byFingerprint = !open.fingerprint.isEmpty && open.fingerprint == session.fingerprint
        let sameSource = open.fingerprint.isEmpty || session.fingerprint.isEmpty || open.fingerprint == session.fingerprint
        let sameSHA1 = open.sha1 == nil || session.declaredSHA1 == nil || open.sha1?.hex == session.declaredSHA1
        return (byToken || byFingerprint) && sameSource && sameSHA1 && session.declaredSize == size && session.striped == open.striped
    }
}
