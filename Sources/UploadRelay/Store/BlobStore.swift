import NIOCore
import UploadProtocol

/// Where verified blobs end up (ARCHITECTURE "Storage and catalog"): begin → write at offset →
/// make durable → commit (atomic) or abort. Calls block: run them off the event loop.
public protocol BlobStore: Sendable {
    /// Opens the staging file `name` and cuts it to `offset` bytes: whatever lies beyond the
    /// durable offset was never acknowledged and is written again. A new upload (`offset` 0)
    /// creates the file; a resume requires it to exist and hold at least `offset` bytes, and
    /// throws ``StoreError`` otherwise (the session must then start over).
    func openStaging(_ name: String, truncatingTo offset: Int64) throws -> any StagingFile
    /// Deletes a staging file; missing is fine.
    func removeStaging(_ name: String) throws
    /// Makes the staged bytes the object `key`, atomically: complete or absent, never partial.
    func commit(_ staging: any StagingFile, as key: ObjectKey) throws
    /// Places a copy of the existing object `source` under `key` (dedup).
    func duplicate(_ source: ObjectKey, as key: ObjectKey) throws
    /// The size of the object `key`, or nil when there is none.
    func size(of key: ObjectKey) throws -> Int64?
    /// Names of staging files, for cleaning up those no session refers to.
    func stagingNames() throws -> [String]
}

/// The bytes of one upload before commit.
public protocol StagingFile: AnyObject, Sendable {
    var name: String { get }
    /// Writes `bytes` at `offset`.
    func write(_ bytes: ByteBuffer, at offset: Int64) throws
    /// Makes every written byte survive a crash.
    func sync() throws
    func close()
}

/// A storage failure, for people: it names the path and the system's reason.
public struct StoreError: Error, Hashable, Sendable, CustomStringConvertible {
    public var description: String
    /// True when the disk is full (ENOSPC, EDQUOT).
    public var isNoSpace: Bool

    public init(_ description: String, isNoSpace: Bool = false) {
        self.description = description
        self.isNoSpace = isNoSpace
    }
}
