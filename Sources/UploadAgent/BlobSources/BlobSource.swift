import NIOCore

/// What a source knows about its blob when opened.
public struct SourceInfo: Hashable, Sendable {
    /// The size, when known in advance (files); nil for streams such as stdin (SPEC §10).
    public var size: UInt64?
    /// Opaque bytes that change when the content may have changed (SPEC §6.2): lets a relay
    /// find this upload again after either side restarted.
    public var fingerprint: [UInt8]

    public init(size: UInt64?, fingerprint: [UInt8]) {
        self.size = size
        self.fingerprint = fingerprint
    }
}

/// Where an upload's bytes come from: a file, stdin, or anything a caller writes.
///
/// Reads happen on a thread pool, one at a time per source and in increasing offsets, only
/// while the agent holds credit. A source may serve reads from large cached blocks whatever
/// size is asked for; a non-seekable source keeps unacknowledged bytes so that an upload can
/// resume after a reconnect (``acknowledge(upTo:)`` lets it drop them).
public protocol BlobSource: AnyObject, Sendable {
    /// A name for messages: the path, or "stdin".
    var displayName: String { get }
    /// Whether `read(at:)` can start anywhere (files) or only at retained offsets (streams).
    var isSeekable: Bool { get }
    /// Opens the source; called once, before any read.
    func open() throws -> SourceInfo
    /// Up to `maxLength` bytes at `offset`. An empty buffer means the end of the blob, unless
    /// ``isEnd(at:)`` says otherwise (a stream with no room left until ACKs arrive).
    func read(at offset: UInt64, maxLength: Int, allocator: ByteBufferAllocator) throws -> ByteBuffer
    /// Whether an empty read at `offset` was the end of the blob.
    func isEnd(at offset: UInt64) -> Bool
    /// Bytes below `offset` are durable on the relay and will never be read again.
    func acknowledge(upTo offset: UInt64)
    /// Checked before HASH: why the blob is no longer the one opened (a file rewritten or replaced during the
    /// upload), or nil when it is unchanged. A changed source is never committed as a mix of two versions.
    func changeSinceOpen() -> String?
    /// Opens the source again after a read threw ``SourceInvalidated`` (an asset the OS replaced, a handle that went
    /// stale): the agent then checks that the fingerprint is the one first opened and reads on from where it was, so
    /// nothing the relay acknowledged is read again. A different fingerprint means different content: the upload
    /// stops, and nothing is committed. The default cannot reopen.
    func reopen() throws -> SourceInfo
    func close()
}

extension BlobSource {
    public func acknowledge(upTo offset: UInt64) {}
    public func isEnd(at offset: UInt64) -> Bool { true }
    public func changeSinceOpen() -> String? { nil }
    public func reopen() throws -> SourceInfo {
        throw SourceError("\(self.displayName) became invalid during the upload and cannot be reopened")
    }
}

/// Thrown by ``BlobSource/read(at:maxLength:allocator:)`` when the source can no longer serve reads but may be
/// reopened (``BlobSource/reopen()``): the agent reopens it, at most ``AgentConfiguration/maxReopensInARow`` times
/// without a successful read in between.
public struct SourceInvalidated: Error, Hashable, Sendable, CustomStringConvertible {
    /// Why, for messages: "the asset was replaced".
    public var reason: String
    public init(_ reason: String) { self.reason = reason }
    public var description: String { "source invalidated: \(self.reason)" }
}

/// A source failed; the message names the file and the reason.
public struct SourceError: Error, Hashable, Sendable, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}
