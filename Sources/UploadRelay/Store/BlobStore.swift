import Foundation
import NIOCore
import UploadProtocol

/// Where verified blobs end up (ARCHITECTURE "Storage and catalog"): begin → write at offset →
/// make durable → commit (atomic) or abort. Calls block: run them off the event loop.
///
/// Objects are kept per account: no account can see, replace or dedup against another's bytes. For the local
/// store the object for key K of account A is the file `<store>/A/K`.
public protocol BlobStore: Sendable {
    /// Opens the staging file `name` and cuts it to `offset` bytes: whatever lies beyond the
    /// durable offset was never acknowledged and is written again. A new upload (`offset` 0)
    /// creates the file; a resume requires it to exist and hold at least `offset` bytes, and
    /// throws ``StoreError`` otherwise (the session must then start over).
    func openStaging(_ name: String, truncatingTo offset: Int64) throws -> any StagingFile
    /// ``openStaging(_:truncatingTo:)`` for an upload that announced `expectedSize` bytes (nil: unknown), so the store
    /// can write a small one the cheap way.
    func openStaging(_ name: String, truncatingTo offset: Int64, expectedSize: Int64?) throws -> any StagingFile
    /// ``openStaging(_:truncatingTo:expectedSize:)`` for the upload of `key` by `account`: a store whose staging is tied
    /// to the object (S3's multipart upload) needs to know which, and, to resume, the parts the catalog recorded.
    func openStaging(
        _ name: String, for key: ObjectKey, account: String, truncatingTo offset: Int64, expectedSize: Int64?, parts: [StagedPart]
    ) throws -> any StagingFile
    /// Opens the staging file of a striped upload of `size` bytes (SPEC §6.7) for one of its streams: never cut (its
    /// other stripes are in it, written through other handles), its end at `size`. With `creating`, a missing file is
    /// made and its name made durable at once (a stripe may be recorded complete before stripe 0 syncs); without, a
    /// missing file is an error.
    func openStripedStaging(_ name: String, size: Int64, creating: Bool) throws -> any StagingFile
    /// Deletes a staging file; missing is fine.
    func removeStaging(_ name: String) throws
    /// Whether the staging file `name` exists.
    func hasStaging(_ name: String) throws -> Bool
    /// Makes the staged bytes the object `key` of `account`, atomically: complete or absent, never partial.
    /// Returns what identifies the stored file, for the catalog.
    func commit(_ staging: any StagingFile, as key: ObjectKey, account: String) throws -> ObjectIdentity
    /// ``commit(_:as:account:)`` for many objects at once (group commit), each result in the order given: a store may
    /// make them durable together (the local store syncs each directory once for all the objects renamed into it).
    func commit(_ batch: [StoreCommit]) -> [Result<ObjectIdentity, any Error>]
    /// Places a copy of the account's existing object `source` under `key` (dedup), provided `source` is still the file
    /// `expected` (it may have been replaced since it was looked up); throws ``StoreError`` otherwise, placing nothing.
    func duplicate(_ source: ObjectKey, expected: ObjectIdentity, as key: ObjectKey, account: String) throws -> ObjectIdentity
    /// What identifies the object `key` of `account` now, or nil when there is none.
    func identity(of key: ObjectKey, account: String) throws -> ObjectIdentity?
    /// Removes the object `key` of `account` (`upload-relay rm`): only call it for an object the catalog records as
    /// this relay's, whose identity was just checked. Nothing there is not an error.
    func removeObject(_ key: ObjectKey, account: String) throws
    /// The SHA-1 of the object's bytes, read whole (startup recovery only), or nil when there is none.
    func contentSHA1(of key: ObjectKey, account: String) throws -> SHA1Digest?
    /// Why `key` cannot be stored for `account` next to the objects it has (a key that is a folder of other keys,
    /// or a key whose folder is an object), naming the key in the way; nil when it can.
    func conflict(for key: ObjectKey, account: String) throws -> String?
    /// Where the object of `key` is, for people and post-commit hooks: a path, or `s3://BUCKET/KEY`.
    func location(of key: ObjectKey, account: String) throws -> String
    /// Staging files and when each was last written, for cleaning up those no session refers to.
    func stagingFiles() throws -> [(name: String, modified: Date)]
    /// The account and key a staging was made for, when its name says (an S3 multipart upload's does): cleanup then
    /// removes it, whatever its age, once no upload holds the key and no session names it. Nil: by age only.
    func stagingOwner(_ name: String) -> (account: String, key: String)?
    /// Where this store keeps an upload's bytes on the relay's own disk, and the most of a blob of `size` bytes it keeps
    /// there at once: the relay admits an upload only when they fit above its free-space reserve (SPEC §7).
    func localSpace(forBlobOf size: Int64) -> (directory: String, bytes: Int64)
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
    public func openStaging(_ name: String, truncatingTo offset: Int64, expectedSize: Int64?) throws -> any StagingFile {
        try self.openStaging(name, truncatingTo: offset)
    }

    public func openStaging(
        _ name: String, for key: ObjectKey, account: String, truncatingTo offset: Int64, expectedSize: Int64?, parts: [StagedPart]
    ) throws -> any StagingFile {
        try self.openStaging(name, truncatingTo: offset, expectedSize: expectedSize)
    }

    /// One commit after the other, for stores with nothing better.
    public func commit(_ batch: [StoreCommit]) -> [Result<ObjectIdentity, any Error>] {
        batch.map { item in Result { try self.commit(item.staging, as: item.key, account: item.account) } }
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
    var name: String { get }
    /// Writes `bytes` at `offset`.
    func write(_ bytes: ByteBuffer, at offset: Int64) throws
    /// Makes every written byte survive a crash.
    func sync() throws
    /// Makes the bytes below `offset` (every one written, in order) survive a crash: true when they all do. A file
    /// makes them all durable; a store that keeps bytes in parts of a least size (S3) may keep back whatever came since
    /// its last part, whole, for the next sync, and answers false: what was durable before still is, nothing more.
    func sync(through offset: Int64) throws -> Bool
    /// What the store calls this staging now: a store may rename it once it holds durable bytes (S3: the name comes to
    /// carry its multipart upload). Recorded with the session at its first durable sync.
    var currentName: String { get }
    /// The parts made durable since the last call, for the catalog to record with the offset (S3); none for a file.
    func takeNewParts() -> [StagedPart]
    /// Reads up to `buffer.count` bytes at `offset` (fewer only at the end of the file); how many were read.
    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int
    func close()
}

extension StagingFile {
    public func sync(through offset: Int64) throws -> Bool {
        try self.sync()
        return true
    }

    public var currentName: String { self.name }

    public func takeNewParts() -> [StagedPart] { [] }
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
