import Foundation
import NIOCore
import UploadProtocol

/// Where verified blobs end up (ARCHITECTURE "Storage and catalog"): begin → write at offset →
/// make durable → commit (atomic) or abort. Every call that touches the store is async: a store that must block (the
/// local directory's system calls) does so on a thread pool of its own, never on its caller's thread.
///
/// Objects are kept per account: no account can see, replace or dedup against another's bytes. For the local
/// store the object for key K of account A is the file `<store>/A/K`.
public protocol BlobStore: Sendable {
    /// What this store can do beyond staging, committing and reading objects: the relay narrows what it offers agents
    /// (stripes, the largest blob) to it when it starts.
    var capabilities: StoreCapabilities { get }
    /// Opens a staging for one upload, as `request` describes: a new one, a resume cut to its durable offset, or one
    /// stream's handle on a striped upload's staging. A resume whose staging is gone or holds fewer than its durable
    /// bytes throws ``StoreError`` (the session must then start over).
    func openStaging(_ request: StagingRequest) async throws -> any StagingFile
    /// Deletes a staging file; missing is fine.
    func removeStaging(_ name: String) async throws
    /// Whether the staging file `name` exists.
    func hasStaging(_ name: String) async throws -> Bool
    /// Makes each staging the object its item names, atomically (complete or absent, never partial), each result in the
    /// order given, with what identifies the stored object for the catalog: a store may make them durable together (the
    /// local store syncs each directory once for all the objects renamed into it). Only stagings this store opened.
    func commit(_ batch: [StoreCommit]) async -> [Result<ObjectIdentity, any Error>]
    /// Places a copy of the account's existing object `source` under `key` (dedup), provided `source` is still the file
    /// `expected` (it may have been replaced since it was looked up); throws ``StoreError`` otherwise, placing nothing.
    func duplicate(_ source: ObjectKey, expected: ObjectIdentity, as key: ObjectKey, account: String) async throws -> ObjectIdentity
    /// What identifies the object `key` of `account` now, or nil when there is none.
    func identity(of key: ObjectKey, account: String) async throws -> ObjectIdentity?
    /// Removes the object `key` of `account` (`upload-relay rm`): only call it for an object the catalog records as
    /// this relay's, whose identity was just checked. Nothing there is not an error.
    func removeObject(_ key: ObjectKey, account: String) async throws
    /// The SHA-1 of the object's bytes, read whole (startup recovery only), or nil when there is none.
    func contentSHA1(of key: ObjectKey, account: String) async throws -> SHA1Digest?
    /// Why `key` cannot be stored for `account` next to the objects it has (a key that is a folder of other keys,
    /// or a key whose folder is an object), naming the key in the way; nil when it can.
    func conflict(for key: ObjectKey, account: String) async throws -> String?
    /// Where the object of `key` is, for people and post-commit hooks: a path, or `s3://BUCKET/KEY`.
    func location(of key: ObjectKey, account: String) throws -> String
    /// Staging files and when each was last written, for cleaning up those no session refers to.
    func stagingFiles() async throws -> [(name: String, modified: Date)]
    /// The account and key a staging was made for, when its name says (an S3 multipart upload's does): cleanup then
    /// removes it, whatever its age, once no upload holds the key and no session names it. Nil: by age only.
    func stagingOwner(_ name: String) -> (account: String, key: String)?
    /// Where this store keeps an upload's bytes on the relay's own disk, and the most of a blob of `size` bytes it keeps
    /// there at once: the relay admits an upload only when they fit above its free-space reserve (SPEC §7).
    func localSpace(forBlobOf size: Int64) -> (directory: String, bytes: Int64)
}

/// Why a key cannot be stored where a store holds keys as paths (a key cannot be both an object and a folder of keys):
/// the same words from every store with the rule (``BlobStore/conflict(for:account:)``).
public enum KeyConflict {
    /// `key` would go under `object`, which is an object.
    public static func underObject(_ object: String, key: ObjectKey) -> String {
        "key \"\(object)\" is an object, so \"\(key)\" cannot be stored under it (a key cannot be both an object and a folder of keys; choose another key)"
    }

    /// `key` is a folder of other keys, `example` one of them.
    public static func folder(_ key: ObjectKey, example: String) -> String {
        "key \"\(key)\" is a folder of other keys (such as \"\(example)\"), so it cannot be an object too (choose another key)"
    }
}

/// What a store can do beyond the staging, commit and object calls every store answers.
public struct StoreCapabilities: Hashable, Sendable {
    /// Striped stagings (``StagingRequest/Layout/striped(size:creating:)``), written by several streams at their
    /// offsets, and ``StagingFile/read(_:at:)``, which a striped upload's commit reads its stripes back with. Without
    /// them, the relay offers agents no stripes (SPEC §6.7).
    public var stripes: Bool
    /// The largest object the store keeps: the relay refuses larger blobs at OPEN.
    public var largestObject: Int64

    public init(stripes: Bool, largestObject: Int64) {
        self.stripes = stripes
        self.largestObject = largestObject
    }
}

/// One upload's staging, as ``BlobStore/openStaging(_:)`` opens it.
public struct StagingRequest: Hashable, Sendable {
    /// How the upload's streams write it.
    public enum Layout: Hashable, Sendable {
        /// One stream, in order: a new staging (`offset` 0, created), or a resume cut to its durable `offset` (never
        /// created: a missing staging must not turn into zeros below the durable offset). Whatever lies beyond the
        /// durable offset was never acknowledged and is written again. `parts`: what the catalog recorded of a store
        /// that keeps bytes in parts (S3), to resume from.
        case sequential(offset: Int64, parts: [StagedPart])
        /// One stream's handle on a striped upload of `size` bytes (SPEC §6.7): never cut (its other stripes are in it,
        /// written through other handles), its end at `size`. With `creating`, a missing staging is made and its name
        /// made durable at once (a stripe may be recorded complete before stripe 0 syncs); without, missing is an error.
        case striped(size: Int64, creating: Bool)
    }

    /// The staging's name, as the session records it.
    public var name: String
    /// The upload's account and key: a store whose staging is tied to the object (S3's multipart upload) needs them.
    public var account: String
    public var key: ObjectKey
    /// The blob's announced size (nil: unknown), so the store can write a small one the cheap way.
    public var expectedSize: Int64?
    public var layout: Layout

    public init(name: String, account: String, key: ObjectKey, expectedSize: Int64?, layout: Layout) {
        self.name = name
        self.account = account
        self.key = key
        self.expectedSize = expectedSize
        self.layout = layout
    }
}

/// One object of a group commit: staged bytes and where they go.
public struct StoreCommit: Sendable {
    public var staging: any StagingFile
    public var key: ObjectKey
    public var account: String
    /// The verified SHA-1 of the bytes, for a store that has the server check them again (S3's `x-amz-checksum-sha1`).
    public var sha1: SHA1Digest?
    /// Replace an object the store holds under `key`; otherwise a store that can refuses (S3: `If-None-Match: *`).
    public var overwrite: Bool

    public init(staging: any StagingFile, key: ObjectKey, account: String, sha1: SHA1Digest? = nil, overwrite: Bool = true) {
        self.staging = staging
        self.key = key
        self.account = account
        self.sha1 = sha1
        self.overwrite = overwrite
    }
}

extension BlobStore {
    /// Commits one staging: ``commit(_:)`` of one item.
    public func commit(_ staging: any StagingFile, as key: ObjectKey, account: String) async throws -> ObjectIdentity {
        guard let result = await self.commit([StoreCommit(staging: staging, key: key, account: account)]).first else {
            throw StoreError("the store answered no result for the commit of \(key)")
        }
        return try result.get()
    }
}

/// What identifies one stored object's bytes: recorded by the catalog at commit, compared before the relay
/// answers STORED or dedups against it, so that only bytes the relay itself verified are ever vouched for.
public struct ObjectIdentity: Hashable, Sendable {
    public var device: UInt64
    public var inode: UInt64
    public var size: Int64
    /// Modification time, nanoseconds since the epoch.
    public var modified: Int64

    public init(device: UInt64, inode: UInt64, size: Int64, modified: Int64) {
        self.device = device
        self.inode = inode
        self.size = size
        self.modified = modified
    }
}

/// The bytes of one upload before commit.
public protocol StagingFile: AnyObject, Sendable {
    /// What the store calls this staging now: a store may rename it once it holds durable bytes (S3: the name comes to
    /// carry its multipart upload). The session records it at its first durable sync.
    var name: String { get }
    /// Writes `bytes` at `offset`.
    func write(_ bytes: ByteBuffer, at offset: Int64) async throws
    /// Makes every written byte survive a crash.
    func sync() async throws
    /// Makes the bytes below `offset` (every one written, in order) survive a crash, as far as the store can. A file
    /// makes them all durable; a store that keeps bytes in parts of a least size (S3) may keep back whatever came since
    /// its last part, whole, for the next sync: what was durable before still is, nothing more.
    func sync(through offset: Int64) async throws -> StagingSync
    /// Reads up to `count` bytes at `offset` (fewer only at the end of the file). Only called on a store whose
    /// ``StoreCapabilities/stripes`` is true.
    func read(_ count: Int, at offset: Int64) async throws -> ByteBuffer
    func close()
}

/// What ``StagingFile/sync(through:)`` made durable.
public enum StagingSync: Hashable, Sendable {
    /// Every byte below the offset, with the parts uploaded since the last sync for the catalog to record (S3); none
    /// for a file.
    case durable(newParts: [StagedPart])
    /// Nothing new: the bytes since the last part wait, whole, for a later sync.
    case heldBack
}

extension StagingFile {
    public func sync(through offset: Int64) async throws -> StagingSync {
        try await self.sync()
        return .durable(newParts: [])
    }
}

/// A storage failure, for people: it names the path and the system's reason.
public struct StoreError: Error, Hashable, Sendable, CustomStringConvertible {
    public var description: String
    /// True when the disk is full (ENOSPC, EDQUOT).
    public var isNoSpace: Bool
    /// True when the object was made visible before the failure (its directory could not be synced, say): the commit
    /// is left for startup recovery to settle, not given up.
    public var madeVisible: Bool
    /// True when the store refused to replace an object under the key (S3's `If-None-Match: *`): one appeared there
    /// that the catalog does not know, and the agent did not ask to overwrite.
    public var alreadyExists: Bool

    /// True when the store cannot tell whether the operation took effect (a request with no answer, a server error):
    /// a commit is then settled by recovery, and a resume is refused for now, not started over.
    public var outcomeUnknown: Bool

    public init(
        _ description: String, isNoSpace: Bool = false, madeVisible: Bool = false, alreadyExists: Bool = false, outcomeUnknown: Bool = false
    ) {
        self.description = description
        self.isNoSpace = isNoSpace
        self.madeVisible = madeVisible
        self.alreadyExists = alreadyExists
        self.outcomeUnknown = outcomeUnknown
    }
}

extension StoreError {
    /// What an agent is told of this failure (SPEC §12.3): what it can act on, never the relay's paths, staging names,
    /// bucket or the store's own words, which go to the relay's log.
    public var agentMessage: String {
        self.isNoSpace ? Self.fullMessage : "the relay's storage failed; retry later"
    }

    /// What an agent is told when the relay's disk is full (its store's, or its catalog's).
    public static let fullMessage = "the relay's storage is full; retry later"
}

extension BlobStore {
    /// A store whose staging names say nothing of their key (the local directory's).
    public func stagingOwner(_ name: String) -> (account: String, key: String)? { nil }
}
