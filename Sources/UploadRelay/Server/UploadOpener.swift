import Foundation
import UploadChecksums
import UploadProtocol

/// The relay's answer to OPEN (SPEC §6, §7): resume, dedup, quota and overwrite rules, decided
/// against the catalog and the store. Blocking: runs on the I/O thread pool.
struct UploadOpener {
    enum Decision {
        /// Nothing to send: the key holds these bytes (or now a copy of them).
        case stored(size: UInt64)
        /// Send from `offset`; the upload is staged in `staging` with SHA-1 state `sha1` at that offset.
        case upload(UploadSession, any StagingFile, SHA1, resumed: Bool)
        case refuse(WireErrorCode, String)
    }

    let services: RelayServices

    func decide(account: Account, open: Frame.Open, key: ObjectKey) -> Decision {
        do {
            return try self.decideThrowing(account: account, open: open, key: key)
        } catch let error as StoreError {
            return .refuse(.storageError, error.description)
        } catch {
            return .refuse(.internalError, "relay failed to open the upload: \(error)")
        }
    }

    private func decideThrowing(account: Account, open: Frame.Open, key: ObjectKey) throws -> Decision {
        let catalog = self.services.catalog
        let store = self.services.store
        let size = open.size.map { Int64($0) }
        if let size, size > self.services.configuration.maxBlobSize {
            return .refuse(.tooLarge, "\(size) bytes is larger than this relay's limit of \(self.services.configuration.maxBlobSize)")
        }
        let existing = try catalog.object(account: account.name, key: key.value)
        if let sha1 = open.sha1, let size {
            if let existing, existing.size == size, existing.sha1 == sha1.hex, try store.size(of: key) == size {
                return .stored(size: UInt64(size))
            }
            if existing != nil && !open.overwrite {
                return .refuse(
                    .alreadyExists, "key \"\(key)\" holds other content; ask to overwrite (--overwrite) or choose another key"
                )
            }
            // Dedup across keys of the same account: the bytes are here already.
            if let twin = try catalog.object(account: account.name, size: size, sha1: sha1.hex),
                let twinKey = try? ObjectKey(validating: twin.key), try store.size(of: twinKey) == size
            {
                guard account.fits(size - (existing?.size ?? 0)) else {
                    return self.quotaRefusal(account, size)
                }
                try store.duplicate(twinKey, as: key)
                try catalog.commitObject(StoredObject(account: account.name, key: key.value, size: size, sha1: sha1.hex), sessionID: nil)
                return .stored(size: UInt64(size))
            }
        }
        if let size, !account.fits(size - (existing?.size ?? 0)) {
            return self.quotaRefusal(account, size)
        }
        if let session = try catalog.session(account: account.name, key: key.value) {
            let byToken = !open.resumeToken.isEmpty && open.resumeToken == session.resumeToken
            let byFingerprint = !open.fingerprint.isEmpty && open.fingerprint == session.fingerprint
            let sameSource = open.fingerprint.isEmpty || session.fingerprint.isEmpty || open.fingerprint == session.fingerprint
            if (byToken || byFingerprint) && sameSource && session.declaredSize == size,
                let sha1 = try? SHA1(importing: session.sha1State), sha1.byteCount == UInt64(session.durableOffset),
                let staging = try? store.openStaging(session.stagingName, truncatingTo: session.durableOffset)
            {
                return .upload(session, staging, sha1, resumed: session.durableOffset > 0)
            }
            // Another version of the source, or a session we cannot trust: start over.
            try store.removeStaging(session.stagingName)
            try catalog.deleteSession(id: session.id)
        }
        let id = Self.randomID()
        var generator = SystemRandomNumberGenerator()
        let session = UploadSession(
            id: id, account: account.name, key: key.value,
            resumeToken: (0..<16).map { _ in UInt8.random(in: 0...255, using: &generator) }, fingerprint: open.fingerprint,
            declaredSize: size, durableOffset: 0, sha1State: SHA1().exportState(), stagingName: id
        )
        let staging = try store.openStaging(session.stagingName, truncatingTo: 0)
        try catalog.putSession(session)
        return .upload(session, staging, SHA1(), resumed: false)
    }

    private func quotaRefusal(_ account: Account, _ size: Int64) -> Decision {
        .refuse(
            .quotaExceeded,
            "account \"\(account.name)\" has \(max(0, (account.quota ?? 0) - account.usedBytes)) bytes of quota left; this blob needs \(size)"
        )
    }

    static func randomID() -> String {
        var generator = SystemRandomNumberGenerator()
        return (0..<16).map { _ in String(UInt8.random(in: 0...255, using: &generator), radix: 16) }
            .map { $0.count == 1 ? "0" + $0 : $0 }.joined()
    }
}
