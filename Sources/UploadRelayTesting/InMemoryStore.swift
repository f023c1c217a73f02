import Foundation
import NIOConcurrencyHelpers
import NIOCore
import UploadChecksums
import UploadProtocol
import UploadRelay

/// A store in memory, for tests and tools: the same answers as the local directory and the S3 store (the store contract
/// suite runs on all three), every call one step under one lock. It keeps what a crash would keep apart from what was
/// only written: ``crash()`` drops every staged byte that no sync made durable, as a machine that lost power would.
///
/// Keys follow the local directory's rule: a key cannot be both an object and a folder of other keys.
public final class InMemoryStore: BlobStore, Sendable {
    public let capabilities: StoreCapabilities

    private struct Staged {
        var bytes: [UInt8]
        /// How many of them a sync made durable.
        var durable: Int
        var modified: Date
        /// Which opening wrote it last: a handle of an earlier opening (since started over) writes nothing.
        var opening: UInt64
    }

    private struct Object {
        var bytes: [UInt8]
        var identity: ObjectIdentity
    }

    private struct Row: Hashable {
        var account: String
        var key: String
    }

    private struct State {
        var staged: [String: Staged] = [:]
        var objects: [Row: Object] = [:]
        /// Counts openings and object versions: every new object gets a new identity.
        var counter: UInt64 = 0
    }

    private let state = NIOLockedValueBox(State())
    /// The stagings it opened that are alive: only those are committed.
    fileprivate let opened = StagingRegistry<InMemoryStaging>()

    /// `largestObject`: the most bytes of one object (a store of a bounded backend, in tests).
    public init(stripes: Bool = true, largestObject: Int64 = .max) {
        self.capabilities = StoreCapabilities(stripes: stripes, largestObject: largestObject)
    }

    /// Drops every staged byte no sync made durable, as a crash would.
    public func crash() {
        self.state.withLockedValue { state in
            for (name, staged) in state.staged {
                var kept = staged
                kept.bytes.removeSubrange(min(kept.durable, kept.bytes.count)...)
                state.staged[name] = kept
            }
        }
    }

    /// The bytes of the object `key` of `account`, or nil.
    public func bytes(of key: String, account: String) -> [UInt8]? {
        self.state.withLockedValue { $0.objects[Row(account: account, key: key)]?.bytes }
    }

    // MARK: Staging

    public func openStaging(_ request: StagingRequest) async throws -> any StagingFile {
        let name = request.name
        guard !name.isEmpty, !name.contains("/") else { throw StoreError("staging name \"\(name)\" is not a plain name") }
        return try self.state.withLockedValue { state in
            state.counter += 1
            let opening = state.counter
            switch request.layout {
            case .sequential(let offset, _):
                if offset == 0 {
                    state.staged[name] = Staged(bytes: [], durable: 0, modified: Date(), opening: opening)
                } else {
                    guard var staged = state.staged[name], staged.bytes.count >= offset else {
                        throw StoreError("staging \(name) holds fewer than its \(offset) durable bytes")
                    }
                    staged.bytes.removeSubrange(Int(offset)...)
                    staged.durable = min(staged.durable, Int(offset))
                    staged.opening = opening
                    state.staged[name] = staged
                }
                return self.opened.registered(InMemoryStaging(store: self, name: name, opening: opening))
            case .striped(let size, let creating):
                guard self.capabilities.stripes else { throw StoreError("this store takes no striped uploads") }
                if state.staged[name] == nil {
                    guard creating else { throw StoreError("striped staging \(name) is gone") }
                    state.staged[name] = Staged(bytes: [UInt8](repeating: 0, count: Int(size)), durable: 0, modified: Date(), opening: 0)
                }
                // Stripes share the staging: every handle writes (opening 0 is every handle's).
                state.staged[name]?.opening = 0
                return self.opened.registered(InMemoryStaging(store: self, name: name, opening: 0))
            }
        }
    }

    fileprivate func write(_ bytes: ByteBuffer, at offset: Int64, name: String, opening: UInt64) throws {
        try self.state.withLockedValue { state in
            guard var staged = state.staged[name], staged.opening == opening else {
                throw StoreError("staging \(name) was removed or opened again")
            }
            let start = Int(offset)
            let end = start + bytes.readableBytes
            if staged.bytes.count < end { staged.bytes.append(contentsOf: repeatElement(0, count: end - staged.bytes.count)) }
            staged.bytes.replaceSubrange(start..<end, with: bytes.readableBytesView)
            staged.modified = Date()
            state.staged[name] = staged
        }
    }

    fileprivate func sync(name: String, opening: UInt64) throws {
        try self.state.withLockedValue { state in
            guard let staged = state.staged[name], staged.opening == opening else {
                throw StoreError("staging \(name) was removed or opened again")
            }
            state.staged[name]?.durable = staged.bytes.count
        }
    }

    fileprivate func read(_ count: Int, at offset: Int64, name: String) throws -> ByteBuffer {
        try self.state.withLockedValue { state in
            guard let staged = state.staged[name] else { throw StoreError("staging \(name) is gone") }
            let start = min(Int(offset), staged.bytes.count)
            let count = max(0, min(count, staged.bytes.count - start))
            return ByteBuffer(bytes: staged.bytes[start..<(start + count)])
        }
    }

    public func removeStaging(_ name: String) async throws {
        self.state.withLockedValue { _ = $0.staged.removeValue(forKey: name) }
    }

    public func hasStaging(_ name: String) async throws -> Bool {
        self.state.withLockedValue { $0.staged[name] != nil }
    }

    public func stagingFiles() async throws -> [(name: String, modified: Date)] {
        self.state.withLockedValue { state in state.staged.map { ($0.key, $0.value.modified) }.sorted { $0.name < $1.name } }
    }

    public func stagingOwner(_ name: String) -> (account: String, key: String)? { nil }

    /// Nothing on the relay's disk.
    public func localSpace(forBlobOf size: Int64) -> (directory: String, bytes: Int64) {
        (NSTemporaryDirectory(), 0)
    }

    // MARK: Objects

    /// Each staging's bytes (synced or not: a commit makes them durable) become the object, in order; a key in conflict
    /// fails alone.
    public func commit(_ batch: [StoreCommit]) async -> [Result<ObjectIdentity, any Error>] {
        self.state.withLockedValue { state in
            batch.map { item in
                Result {
                    guard let staging = self.opened.own(item.staging) else {
                        throw StoreError("staging \(item.staging.name) is not this store's")
                    }
                    guard let staged = state.staged[staging.name] else { throw StoreError("staging \(staging.name) is gone") }
                    if let conflict = Self.conflict(state, key: item.key, account: item.account) { throw StoreError(conflict) }
                    guard Int64(staged.bytes.count) <= self.capabilities.largestObject else {
                        throw StoreError("\(staged.bytes.count) bytes is more than this store's largest object")
                    }
                    state.staged[staging.name] = nil
                    return Self.place(&state, staged.bytes, key: item.key, account: item.account)
                }
            }
        }
    }

    private static func place(_ state: inout State, _ bytes: [UInt8], key: ObjectKey, account: String) -> ObjectIdentity {
        state.counter += 1
        let identity = ObjectIdentity(device: 0, inode: state.counter, size: Int64(bytes.count), modified: 0)
        state.objects[Row(account: account, key: key.value)] = Object(bytes: bytes, identity: identity)
        return identity
    }

    public func duplicate(_ source: ObjectKey, expected: ObjectIdentity, as key: ObjectKey, account: String) async throws -> ObjectIdentity {
        try self.state.withLockedValue { state in
            guard let object = state.objects[Row(account: account, key: source.value)], object.identity == expected else {
                throw StoreError("\(account)/\(source) changed since it was verified")
            }
            if let conflict = Self.conflict(state, key: key, account: account) { throw StoreError(conflict) }
            return Self.place(&state, object.bytes, key: key, account: account)
        }
    }

    public func identity(of key: ObjectKey, account: String) async throws -> ObjectIdentity? {
        self.state.withLockedValue { $0.objects[Row(account: account, key: key.value)]?.identity }
    }

    public func removeObject(_ key: ObjectKey, account: String) async throws {
        self.state.withLockedValue { _ = $0.objects.removeValue(forKey: Row(account: account, key: key.value)) }
    }

    public func contentSHA1(of key: ObjectKey, account: String) async throws -> SHA1Digest? {
        guard let bytes = self.bytes(of: key.value, account: account) else { return nil }
        var sha1 = SHA1()
        bytes.withUnsafeBytes { sha1.update($0) }
        return SHA1Digest(bytes: sha1.finalize())
    }

    public func conflict(for key: ObjectKey, account: String) async throws -> String? {
        self.state.withLockedValue { Self.conflict($0, key: key, account: account) }
    }

    /// The local directory's rule: a key under an object, or a key that is a folder of others.
    private static func conflict(_ state: State, key: ObjectKey, account: String) -> String? {
        let segments = key.segments
        for index in 0..<(segments.count - 1) {
            let prefix = segments[0...index].joined(separator: "/")
            if state.objects[Row(account: account, key: prefix)] != nil { return KeyConflict.underObject(prefix, key: key) }
        }
        if let under = state.objects.keys.first(where: { $0.account == account && $0.key.hasPrefix(key.value + "/") }) {
            return KeyConflict.folder(key, example: under.key)
        }
        return nil
    }

    public func location(of key: ObjectKey, account: String) throws -> String {
        "memory:" + account + "/" + key.value
    }
}

/// A handle on a staging of ``InMemoryStore``.
final class InMemoryStaging: StagingFile, Sendable {
    let store: InMemoryStore
    let name: String
    let opening: UInt64

    init(store: InMemoryStore, name: String, opening: UInt64) {
        self.store = store
        self.name = name
        self.opening = opening
    }

    deinit {
        self.store.opened.forget(ObjectIdentifier(self))
    }

    func write(_ bytes: ByteBuffer, at offset: Int64) async throws {
        try self.store.write(bytes, at: offset, name: self.name, opening: self.opening)
    }

    func sync() async throws {
        try self.store.sync(name: self.name, opening: self.opening)
    }

    func read(_ count: Int, at offset: Int64) async throws -> ByteBuffer {
        try self.store.read(count, at: offset, name: self.name)
    }

    func close() {}
}
