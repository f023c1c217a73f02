import Foundation
import UploadChecksums
import UploadProtocol

/// The relay's answer to OPEN (SPEC §6, §7): resume, dedup, quota, overwrite and key-conflict rules, decided
/// against the catalog and the store. Blocking: runs on the I/O thread pool.
struct UploadOpener {
    enum Decision {
        /// Nothing to send: the key holds these bytes (or now a copy of them).
        case stored(size: UInt64)
        /// Send from the session's durable offset; the upload is staged in `staging` with SHA-1 state `sha1` there.
        /// `byteLimit` bounds an upload of unknown size by the quota left and the relay's largest blob.
        case upload(UploadSession, any StagingFile, SHA1, resumed: Bool, byteLimit: Int64?)
        case refuse(WireErrorCode, String)
    }

    let services: RelayServices

    func decide(account: Account, open: Frame.Open, key: ObjectKey) -> Decision {
        do {
            return try self.decideThrowing(account: account, open: open, key: key)
        } catch let error as StoreError {
            return .refuse(.storageError, error.description)
        } catch let error as CatalogError {
            return .refuse(.quotaExceeded, error.description)
        } catch {
            return .refuse(.internalError, "relay failed to open the upload: \(error)")
        }
    }

    /// The catalog's object for `key`, when the file the store holds is still the one the relay committed (never
    /// vouch for bytes by their size alone: issue 6 finding 2).
    static func verifiedObject(_ object: StoredObject?, services: RelayServices) throws -> StoredObject? {
        guard let object, let identity = object.identity, let key = try? ObjectKey(validating: object.key) else { return nil }
        return try services.store.identity(of: key, account: object.account) == identity ? object : nil
    }

    private func decideThrowing(account: Account, open: Frame.Open, key: ObjectKey) throws -> Decision {
        let catalog = self.services.catalog
        let store = self.services.store
        let name = account.name
        let size = open.size.map { Int64($0) }
        if let size, size > self.services.configuration.maxBlobSize {
            return .refuse(.tooLarge, "\(size) bytes is larger than this relay's limit of \(self.services.configuration.maxBlobSize)")
        }
        if let conflict = try store.conflict(for: key, account: name) {
            return .refuse(.invalidKey, conflict)
        }
        let existing = try catalog.object(account: name, key: key.value)
        if let sha1 = open.sha1, let size {
            if let verified = try Self.verifiedObject(existing, services: self.services), verified.size == size, verified.sha1 == sha1.hex {
                return .stored(size: UInt64(size))
            }
            if existing != nil && !open.overwrite {
                return .refuse(.alreadyExists, Self.alreadyExists(key))
            }
            // Dedup within the account: the bytes are here already, verified by this relay.
            for twin in try catalog.object(account: name, size: size, sha1: sha1.hex) where twin.key != key.value {
                guard let twinKey = try? ObjectKey(validating: twin.key), let expected = twin.identity,
                    try Self.verifiedObject(twin, services: self.services) != nil
                else {
                    continue
                }
                let commit = PendingCommit(account: name, key: key.value, size: size, sha1: sha1.hex, sessionID: nil)
                try catalog.beginCommit(commit)
                let identity: ObjectIdentity
                do {
                    // The twin is not claimed: the store links it only if it is still the file verified above.
                    identity = try store.duplicate(twinKey, expected: expected, as: key, account: name)
                } catch let error as StoreError where error.madeVisible {
                    throw error
                } catch {
                    try? catalog.abandonCommit(account: name, key: key.value)
                    if error is StoreError { continue }
                    throw error
                }
                try catalog.finishCommit(commit, identity: identity)
                if let session = try catalog.session(account: name, key: key.value) {
                    try store.removeStaging(session.stagingName)
                    try catalog.deleteSession(id: session.id)
                }
                return .stored(size: UInt64(size))
            }
        }
        let use = try catalog.quotaUse(account: name, excludingKey: key.value, activeKeys: self.services.claims.activeKeys(of: name))
        let growth = (size ?? 0) - (existing?.size ?? 0)
        if growth > use.left {
            return .refuse(.quotaExceeded, use.refusal(account: name, needed: growth))
        }
        // Saturating: with no quota `left` is Int64.max (issue 6 soak finding: the wrapped sum refused re-sent stdin).
        let room = use.left > Int64.max - (existing?.size ?? 0) ? Int64.max : use.left + (existing?.size ?? 0)
        let byteLimit = size == nil ? min(self.services.configuration.maxBlobSize, room) : nil
        if let session = try catalog.session(account: name, key: key.value) {
            let byToken = !open.resumeToken.isEmpty && open.resumeToken == session.resumeToken
            let byFingerprint = !open.fingerprint.isEmpty && open.fingerprint == session.fingerprint
            let sameSource = open.fingerprint.isEmpty || session.fingerprint.isEmpty || open.fingerprint == session.fingerprint
            let sameSHA1 = open.sha1 == nil || session.declaredSHA1 == nil || open.sha1?.hex == session.declaredSHA1
            if (byToken || byFingerprint) && sameSource && sameSHA1 && session.declaredSize == size,
                let sha1 = try? SHA1(importing: session.sha1State), sha1.byteCount == UInt64(session.durableOffset),
                let staging = try? store.openStaging(session.stagingName, truncatingTo: session.durableOffset)
            {
                return .upload(session, staging, sha1, resumed: session.durableOffset > 0, byteLimit: byteLimit)
            }
            // Another version of the source, or a session we cannot trust: start over.
            try store.removeStaging(session.stagingName)
            try catalog.deleteSession(id: session.id)
        }
        let id = Self.randomID()
        var generator = SystemRandomNumberGenerator()
        let session = UploadSession(
            id: id, account: name, key: key.value,
            resumeToken: (0..<16).map { _ in UInt8.random(in: 0...255, using: &generator) }, fingerprint: open.fingerprint,
            declaredSize: size, durableOffset: 0, sha1State: SHA1().exportState(), stagingName: id, declaredSHA1: open.sha1?.hex
        )
        let staging = try store.openStaging(session.stagingName, truncatingTo: 0)
        try catalog.putSession(session)
        return .upload(session, staging, SHA1(), resumed: false, byteLimit: byteLimit)
    }

    static func alreadyExists(_ key: ObjectKey) -> String {
        "key \"\(key)\" holds other content; ask to overwrite (--overwrite) or choose another key"
    }

    static func randomID() -> String {
        var generator = SystemRandomNumberGenerator()
        return (0..<16).map { _ in String(UInt8.random(in: 0...255, using: &generator), radix: 16) }
            .map { $0.count == 1 ? "0" + $0 : $0 }.joined()
    }
}
