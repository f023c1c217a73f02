import Foundation
import Logging

/// What the status endpoint says of one key.
public struct KeyStatus: Hashable, Sendable, Codable {
    public enum Status: String, Hashable, Sendable, Codable {
        /// An upload of the key is under way (whether or not an older object is stored under it).
        case uploading
        /// The object is stored, whole and verified.
        case stored
    }

    public var key: String
    public var status: Status
    /// Stored: the object's size. Uploading: the bytes the relays hold durably, which an agent resuming does not send
    /// again (an upload longer than one sync shows here from its OPEN, with 0 bytes; a shorter one is committed at once).
    public var bytes: Int64
    /// The object's size, or the size the upload announced; absent when it announced none (a stream).
    public var size: Int64?
    /// The object's SHA-1, hex; stored objects only.
    public var sha1: String?
    /// `full` while the relay that answers has no room to stage uploads (SPEC §7): an upload under way waits for space.
    /// Absent otherwise.
    public var relayStorage: String?

    enum CodingKeys: String, CodingKey {
        case key, status, bytes, size, sha1
        case relayStorage = "relay_storage"
    }

    public init(key: String, status: Status, bytes: Int64, size: Int64?, sha1: String?) {
        self.key = key
        self.status = status
        self.bytes = bytes
        self.size = size
        self.sha1 = sha1
    }

    public init(_ object: StoredObject) {
        self.init(key: object.key, status: .stored, bytes: object.size, size: object.size, sha1: object.sha1)
    }

    public init(_ session: UploadSession) {
        self.init(key: session.key, status: .uploading, bytes: session.durableOffset, size: session.declaredSize, sha1: nil)
    }
}

/// A page of an account's keys: `next` is the `after` of the next page, nil on the last.
public struct KeyStatusPage: Hashable, Sendable, Codable {
    public var entries: [KeyStatus]
    public var next: String?
    /// `full` while the relay that answers has no room to stage uploads; absent otherwise.
    public var relayStorage: String?

    enum CodingKeys: String, CodingKey {
        case entries, next
        case relayStorage = "relay_storage"
    }

    /// One entry per key, in the UTF-8 order of the keys, an upload under way before the object it replaces:
    /// `objects` and `sessions` are each the first `limit + 1` of their kind after the page's start, in that order, so
    /// the first `limit + 1` keys of their union are the first of all the keys.
    public static func merge(objects: [StoredObject], sessions: [UploadSession], limit: Int) -> KeyStatusPage {
        var byKey: [String: KeyStatus] = [:]
        for object in objects { byKey[object.key] = KeyStatus(object) }
        for session in sessions { byKey[session.key] = KeyStatus(session) }
        let sorted = byKey.values.sorted { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }
        let entries = Array(sorted.prefix(limit))
        return KeyStatusPage(entries: entries, next: sorted.count > limit ? entries.last?.key : nil)
    }
}

/// Answers ``StatusRequest``s from the catalog, for the token's account only. Blocks (the catalog does): run it off
/// the event loop.
public struct StatusResponder: Sendable {
    /// What the status endpoint reads: the token's account, its upload sessions and its objects. Nothing is written.
    public typealias Reads = AccountCatalog & SessionCatalog & ObjectIndex

    public let catalog: any Reads
    public let logger: Logger
    /// Whether the relay's storage is full now (said in every answer while it is).
    let storageFull: @Sendable () -> Bool

    public init(catalog: any Reads, logger: Logger) {
        self.init(catalog: catalog, logger: logger, storageFull: { false })
    }

    init(catalog: any Reads, logger: Logger, storageFull: @escaping @Sendable () -> Bool) {
        self.catalog = catalog
        self.logger = logger
        self.storageFull = storageFull
    }

    /// The JSON body of the answer, or the refusal to send instead.
    public func respond(to request: StatusRequest) async throws(StatusRefusal) -> [UInt8] {
        do {
            let account = try await self.account(request.token)
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            let storage = self.storageFull() ? "full" : nil
            switch request.query {
            case .key(let key):
                var status: KeyStatus
                if let session = try await self.catalog.session(account: account, key: key) {
                    status = KeyStatus(session)
                } else if let object = try await self.catalog.object(account: account, key: key) {
                    status = KeyStatus(object)
                } else {
                    throw StatusRefusal(.notFound, "no upload under way and no object for key \"\(key)\"")
                }
                status.relayStorage = storage
                return Array(try encoder.encode(status))
            case .list(let prefix, let after, let limit):
                let objects = try await self.catalog.objects(account: account, prefix: prefix, after: after, limit: limit + 1)
                let sessions = try await self.catalog.sessions(account: account, prefix: prefix, after: after, limit: limit + 1)
                var page = KeyStatusPage.merge(objects: objects, sessions: sessions, limit: limit)
                page.relayStorage = storage
                return Array(try encoder.encode(page))
            }
        } catch let refusal as StatusRefusal {
            throw refusal
        } catch {
            self.logger.warning("status request failed", metadata: ["error": "\(error)"])
            throw StatusRefusal(.unavailable, "the relay could not read its catalog; try again")
        }
    }

    /// The account whose token it is.
    func account(_ token: String) async throws -> String {
        guard let account = try await self.catalog.account(tokenHash: Tokens.hash(Array(token.utf8))) else {
            throw StatusRefusal(.unauthorized, "the token is not one this relay gives (upload-relay token add)")
        }
        guard !account.revoked else {
            throw StatusRefusal(.unauthorized, "the token of account \"\(account.name)\" was revoked")
        }
        return account.name
    }
}
