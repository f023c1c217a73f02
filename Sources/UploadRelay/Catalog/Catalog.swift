import Foundation

/// An account: who may upload, with how much room (SPEC §2.3).
public struct Account: Hashable, Sendable {
    public var name: String
    /// Bytes the account may hold; nil means no limit.
    public var quota: Int64?
    /// Bytes of committed objects.
    public var usedBytes: Int64
    public var revoked: Bool
    public var createdAt: Date

    public init(name: String, quota: Int64?, usedBytes: Int64 = 0, revoked: Bool = false, createdAt: Date = Date()) {
        self.name = name
        self.quota = quota
        self.usedBytes = usedBytes
        self.revoked = revoked
        self.createdAt = createdAt
    }

    /// Whether `bytes` more fit the quota.
    public func fits(_ bytes: Int64) -> Bool {
        guard let quota = self.quota else { return true }
        return self.usedBytes + bytes <= quota
    }
}

/// An unfinished upload: what a resume needs after either side restarted (SPEC §6).
public struct UploadSession: Hashable, Sendable {
    public var id: String
    public var account: String
    public var key: String
    public var resumeToken: [UInt8]
    public var fingerprint: [UInt8]
    public var declaredSize: Int64?
    /// Every byte below this offset is fsynced in the staging file.
    public var durableOffset: Int64
    /// The SHA-1 state at `durableOffset` (``UploadChecksums/SHA1/exportState()``).
    public var sha1State: [UInt8]
    /// The staging file's name in the store's staging area.
    public var stagingName: String
    public var updatedAt: Date

    public init(
        id: String, account: String, key: String, resumeToken: [UInt8], fingerprint: [UInt8], declaredSize: Int64?,
        durableOffset: Int64, sha1State: [UInt8], stagingName: String, updatedAt: Date = Date()
    ) {
        self.id = id
        self.account = account
        self.key = key
        self.resumeToken = resumeToken
        self.fingerprint = fingerprint
        self.declaredSize = declaredSize
        self.durableOffset = durableOffset
        self.sha1State = sha1State
        self.stagingName = stagingName
        self.updatedAt = updatedAt
    }
}

/// A committed, verified object.
public struct StoredObject: Hashable, Sendable {
    public var account: String
    public var key: String
    public var size: Int64
    /// Lowercase hex.
    public var sha1: String
    public var committedAt: Date

    public init(account: String, key: String, size: Int64, sha1: String, committedAt: Date = Date()) {
        self.account = account
        self.key = key
        self.size = size
        self.sha1 = sha1
        self.committedAt = committedAt
    }
}

/// Errors a catalog reports to people.
public enum CatalogError: Error, Hashable, Sendable, CustomStringConvertible {
    case accountExists(String)
    case unknownAccount(String)
    case quotaExceeded(account: String, needed: Int64, quota: Int64, used: Int64)

    public var description: String {
        switch self {
        case .accountExists(let name):
            return "account \"\(name)\" already exists (revoke it first, or pick another name)"
        case .unknownAccount(let name):
            return "no account named \"\(name)\" (see: upload-relay token list)"
        case .quotaExceeded(let account, let needed, let quota, let used):
            return "account \"\(account)\" would exceed its quota: \(used) + \(needed) bytes > \(quota)"
        }
    }
}

/// The relay's durable memory: accounts and hashed tokens, quotas, upload sessions and the
/// object index by SHA-1 (ARCHITECTURE "Storage and catalog"). Calls block: run them off the event loop.
public protocol Catalog: Sendable {
    func addAccount(name: String, tokenHash: [UInt8], quota: Int64?) throws
    func account(tokenHash: [UInt8]) throws -> Account?
    func account(named name: String) throws -> Account?
    func accounts() throws -> [Account]
    /// Revokes the account's token; false when there is no such account.
    func revokeAccount(named name: String) throws -> Bool

    func session(account: String, key: String) throws -> UploadSession?
    /// Records a new session, replacing any other session of the same account and key.
    func putSession(_ session: UploadSession) throws
    func updateDurable(sessionID: String, offset: Int64, sha1State: [UInt8]) throws
    func deleteSession(id: String) throws
    func sessions(updatedBefore date: Date) throws -> [UploadSession]

    func object(account: String, key: String) throws -> StoredObject?
    func object(account: String, size: Int64, sha1: String) throws -> StoredObject?
    /// Records a committed object (replacing the key's previous one), charges the quota and
    /// deletes the session, in one transaction. Throws ``CatalogError/quotaExceeded(account:needed:quota:used:)``.
    func commitObject(_ object: StoredObject, sessionID: String?) throws
}
