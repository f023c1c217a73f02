import Foundation
import Logging
import UploadChecksums
import UploadProtocol
import NIOConcurrencyHelpers

/// The relay's rules for OPEN and for commit (SPEC §6, §7, §8.3): revocation, resume, dedup, quota, overwrite and
/// key conflicts, decided against the catalog and the store; and the one place where store and catalog errors
/// become wire codes.
package struct UploadPolicy: Sendable {
    enum OpenDecision {
        /// Nothing to send: the key holds these bytes (or now a copy of them).
        case stored(size: UInt64)
        /// A PROBE matched an object that may hold these bytes: the agent opens again with the whole SHA-1 (SPEC §7.1).
        case confirm
        /// Send from the session's durable offset; the upload is staged in `staging` with SHA-1 state `sha1` there.
        /// `recorded`: the catalog holds the session (a new one is recorded by its first durable sync).
        /// `byteLimit` bounds an upload of unknown size by the quota left and the relay's largest blob.
        case upload(UploadSession, any StagingFile, SHA1, recorded: Bool, resumed: Bool, byteLimit: Int64?)
        /// A PART stream's stripe `index` of the striped `session`, written into its staging file (SPEC §6.7).
        case stripe(UploadSession, any StagingFile, index: Int)
        case refuse(WireErrorCode, String)
    }

    /// Why a stream ends in error, and whether the bytes the relay holds are still worth a resume.
    package struct Refusal: Error, Hashable {
        var code: WireErrorCode
        var message: String
        /// Keep the session (and its durable bytes) for a resume: the failure was the relay's, not the bytes'.
        var keepSession: Bool
    }

    let configuration: RelayConfiguration
    let catalog: any Catalog
    let store: any BlobStore
    /// Keys with an upload in progress, here and (with a shared catalog) on other relays.
    let claims: KeyClaims
    /// The relay's disk: what open uploads will still stage there.
    let space: StorageSpace
    let executor: RelayExecutor
    let logger: Logger
    /// Told when commits queued events for the post-commit hooks.
    let commitEvents: CommitEventSignal

    package init(
        configuration: RelayConfiguration, catalog: any Catalog, store: any BlobStore, claims: KeyClaims, space: StorageSpace,
        executor: RelayExecutor, logger: Logger, commitEvents: CommitEventSignal
    ) {
        self.configuration = configuration
        self.catalog = catalog
        self.store = store
        self.claims = claims
        self.space = space
        self.executor = executor
        self.logger = logger
        self.commitEvents = commitEvents
    }

    /// The answer to OPEN of `key` by `account` (as it was at HELLO; read again here).
    func open(account: Account, open: Frame.Open, key: ObjectKey) async -> OpenDecision {
        // The session whose bytes were promised disk space here, if one was.
        var promised: String? = nil
        do {
            // Quota, revocation and dedup decisions read the account as it is now, not as it was at HELLO.
            guard let current = try await self.currentAccount(of: account) else {
                return .refuse(.unauthenticated, Self.notPrincipal(account.name))
            }
            if let part = open.part {
                return try await self.openStripe(account: current, open: open, key: key, index: Int(part))
            }
            return try await self.openThrowing(account: current, open: open, key: key, promised: &promised)
        } catch {
            // Space this OPEN was promised before the failure is free again (never another upload's: a PART's failure
            // leaves its main stream's promise alone).
            if let promised { self.space.release(upload: promised) }
            let refusal = Self.refusal(for: error, doing: "open the upload", key: key, logger: self.logger)
            return .refuse(refusal.code, refusal.message)
        }
    }

    /// The one mapping of store and catalog failures to wire codes (SPEC §10). What the agent is told names nothing of
    /// the relay's (paths, bucket, database: SPEC §12.3); what failed, in the store's or the database's words, goes to
    /// `logger`.
    static func refusal(for error: any Error, doing what: String, key: ObjectKey, logger: Logger) -> Refusal {
        func logged(_ refusal: Refusal) -> Refusal {
            logger.log(
                level: StorageSpace.isDiskFull(error) ? .warning : .error,
                "could not \(what)",
                metadata: ["upload.key": "\(key)", "error": "\(error)", "wire.code": "\(refusal.code.name)"]
            )
            return refusal
        }
        switch error {
        case let refusal as Refusal:
            return refusal
        case _ where StorageSpace.isDiskFull(error):
            // The store's disk or the catalog's (both the relay's own): retryable.
            return logged(Refusal(code: .storageError, message: StoreError.fullMessage, keepSession: true))
        case let error as StoreError where error.alreadyExists:
            // Never to be stored there without an overwrite: like the catalog's own ALREADY_EXISTS, the session goes.
            return logged(Refusal(code: .alreadyExists, message: Self.alreadyExists(key), keepSession: false))
        case let error as StoreError:
            return logged(Refusal(code: .storageError, message: error.agentMessage, keepSession: true))
        case let error as CatalogError:
            switch error {
            case .unknownSession:
                // The session's id names its staging: the agent hears only that the upload must start again.
                return logged(
                    Refusal(
                        code: .storageError, message: "the upload's session on the relay is gone (expired or replaced); upload again",
                        keepSession: false))
            case .quotaExceeded:
                return Refusal(code: .quotaExceeded, message: error.description, keepSession: false)
            case .unavailable, .accountExists, .unknownAccount, .invalidAccountName, .accountInUse:
                return logged(Refusal(code: .internalError, message: "the relay failed to \(what); retry later", keepSession: true))
            }
        default:
            return logged(Refusal(code: .internalError, message: "the relay failed to \(what); retry later", keepSession: true))
        }
    }

    /// The catalog's object for `key`, when the file the store holds is still the one the relay committed (never
    /// vouch for bytes by their size alone: a file replaced behind the relay's back may have the same size).
    static func verifiedObject(_ object: StoredObject?, store: any BlobStore) async throws -> StoredObject? {
        guard let object, let identity = object.identity, let key = try? ObjectKey(validating: object.key) else { return nil }
        return try await store.identity(of: key, account: object.account) == identity ? object : nil
    }

    /// OPEN as facts, plan, execution: the key claimed across relays and any commit of it left undecided settled, the
    /// facts read in one pass (``facts(_:key:account:)``), the decision taken by ``OpenPlanner`` alone, and carried out
    /// here (a copy linked from a twin, the quota and disk space admitted, a session resumed or started).
    private func openThrowing(account: Account, open: Frame.Open, key: ObjectKey, promised: inout String?) async throws -> OpenDecision {
        let name = account.name
        if self.claims.acrossRelays {
            // One relay at a time uploads a key, whichever relay the agent reached: two would stage and commit it
            // twice.
            guard try await self.claims.lockAcrossRelays(account: name, key: key.value) else {
                return .refuse(.keyBusy, "another relay has an upload of \"\(key)\" in progress; retry when it ends")
            }
        }
        if let stored = try await self.settleUndecidedCommits(open: open, key: key, account: name) {
            return stored
        }
        var facts = try await self.facts(open, key: key, account: name)
        while true {
            switch OpenPlanner.plan(open, key: key, facts) {
            case .stored(let size):
                return .stored(size: size)
            case .refuse(let code, let message):
                return .refuse(code, message)
            case .confirm:
                return .confirm
            case .duplicate(let twins):
                if let stored = try await self.duplicate(twins, open: open, key: key, account: name) {
                    return stored
                }
                // None could be linked (each file changed since it was verified): decide again without them.
                facts.twins = []
            case .upload(let upload):
                return try await self.startUpload(upload, open: open, key: key, account: name, promised: &promised)
            }
        }
    }

    /// A commit of the key left undecided (the store's answer lost, as S3's to a CompleteMultipartUpload that took
    /// effect; or a relay that died, here or elsewhere): settled now, under the key, before the upload looks at the
    /// key's object and session. Otherwise the resume found its multipart upload completed, started over, and the new
    /// commit met the object it had made (a 412). A store that still does not answer refuses the OPEN for now (throws).
    /// STORED when the upload this OPEN resumes is the one whose commit took effect (the agent heard STORAGE_ERROR, S3's
    /// answer lost after it completed): never started over from 0, which would re-send the whole blob and drop its
    /// acknowledged bytes (SPEC §6.2).
    private func settleUndecidedCommits(open: Frame.Open, key: ObjectKey, account name: String) async throws -> OpenDecision? {
        let catalog = self.catalog
        if let commit = try await catalog.pendingCommit(account: name, key: key.value) {
            var committing: UploadSession? = nil
            if let id = commit.sessionID, let session = try await catalog.session(account: name, key: key.value), session.id == id {
                committing = session
            }
            let recorded = try await RelayRuntime.settle(commit, catalog: catalog, store: self.store, logger: self.logger)
            if recorded, let committing, OpenPlanner.resumes(open, committing), open.sha1.map({ $0.hex == commit.sha1 }) ?? true {
                return .stored(size: UInt64(commit.size))
            }
        }
        return nil
    }

    /// What ``OpenPlanner`` decides from, read in one pass: the store's view of the key, its object (verified when OPEN
    /// states a SHA-1), the verified twins with OPEN's bytes, a PROBE's match, and the key's unfinished upload.
    private func facts(_ open: Frame.Open, key: ObjectKey, account name: String) async throws -> OpenFacts {
        let catalog = self.catalog
        let size = open.size.map { Int64($0) }
        var facts = OpenFacts(maxBlobSize: self.configuration.maxBlobSize, syncBytes: self.configuration.syncBytes)
        if let size, size > facts.maxBlobSize {
            return facts
        }
        facts.conflict = try await self.store.conflict(for: key, account: name)
        facts.existing = try await catalog.object(account: name, key: key.value)
        if let sha1 = open.sha1, let size {
            facts.existingVerified = try await Self.verifiedObject(facts.existing, store: self.store) != nil
            let holdsThem = facts.existingVerified && facts.existing?.size == size && facts.existing?.sha1 == sha1.hex
            // Twins only where the planner can use them: a key holding these bytes, or other bytes without OVERWRITE,
            // is decided without (and an OPEN of a photo already stored costs no search of the account's objects).
            let twinsMatter = !holdsThem && (facts.existing == nil || open.overwrite)
            if twinsMatter {
                // Verified one at a time when linked (``duplicate(_:open:key:account:)``): the first that is still its
                // committed file is enough.
                facts.twins = try await catalog.object(account: name, size: size, sha1: sha1.hex).filter { twin in
                    twin.key != key.value && twin.identity != nil && (try? ObjectKey(validating: twin.key)) != nil
                }
            }
        }
        if let probe = open.probe, let size {
            // Any object that may hold these bytes, verified by this relay as in the SHA-1 case: the agent confirms.
            let candidates = try await catalog.probeCandidates(account: name, size: size, probe: probe.hex)
            for candidate in candidates where try await Self.verifiedObject(candidate, store: self.store) != nil {
                facts.probeMatched = true
                break
            }
        }
        facts.session = try await catalog.session(account: name, key: key.value)
        if let session = facts.session, let sha1 = try? SHA1(importing: session.sha1State) {
            facts.sessionHashUsable = sha1.byteCount == UInt64(session.durableOffset)
        }
        return facts
    }

    /// Links a copy of the first of `twins` whose file is still the one verified under the key, committed as any
    /// upload is (quota reserved, then recorded); the key's unfinished upload goes. Nil when none could be linked.
    private func duplicate(_ twins: [StoredObject], open: Frame.Open, key: ObjectKey, account name: String) async throws -> OpenDecision? {
        let (catalog, store) = (self.catalog, self.store)
        guard let sha1 = open.sha1, let size = open.size.map({ Int64($0) }) else { return nil }
        for twin in twins {
            guard let twinKey = try? ObjectKey(validating: twin.key), let expected = twin.identity,
                try await Self.verifiedObject(twin, store: self.store) != nil
            else { continue }
            let commit = PendingCommit(
                account: name, key: key.value, size: size, sha1: sha1.hex, sessionID: nil, probeSHA1: twin.probeSHA1,
                location: try self.eventLocation(key, account: name)
            )
            try await catalog.beginCommit(commit)
            let identity: ObjectIdentity
            do {
                // The twin is not claimed: the store links it only if it is still the file verified above.
                identity = try await store.duplicate(twinKey, expected: expected, as: key, account: name)
            } catch let error as StoreError where error.madeVisible {
                throw error
            } catch {
                try? await catalog.abandonCommit(account: name, key: key.value)
                if error is StoreError { continue }
                throw error
            }
            try await catalog.finishCommit(commit, identity: identity)
            self.eventsQueued(commit.location != nil)
            if let session = try await catalog.session(account: name, key: key.value) {
                try await store.removeStaging(session.stagingName)
                try await catalog.deleteSession(id: session.id)
            }
            return .stored(size: UInt64(size))
        }
        return nil
    }

    /// The upload `plan` decided: admitted against the quota (the announced size held for it while it is open), then
    /// resumed when its staging still holds its durable bytes, else started over; disk space promised to it.
    private func startUpload(
        _ plan: OpenUpload, open: Frame.Open, key: ObjectKey, account name: String, promised: inout String?
    ) async throws -> OpenDecision {
        let (catalog, store) = (self.catalog, self.store)
        let size = open.size.map { Int64($0) }
        let claims = self.claims
        let use = try await claims.admitting(account: name) { active in
            let use = try await catalog.admit(account: name, key: key.value, announced: size ?? 0, growth: plan.growth, active: active)
            // Counted by the OPENs of the account's other keys while this one is open, session recorded or not. Only
            // once admitted: a refused upload's size, counted until its stream closed, would refuse uploads that fit
            // beside it (a re-run's every file refused after one too large for the quota).
            if plan.growth <= use.left { claims.announce(KeyClaims.name(account: name, key: key.value), size: size ?? 0) }
            return use
        }
        if plan.growth > use.left {
            return .refuse(.quotaExceeded, use.refusal(account: name, needed: plan.growth))
        }
        // Saturating: with no quota `left` is Int64.max, and a wrapped sum would refuse a re-sent stream of unknown
        // size.
        let room = use.left > Int64.max - plan.replacing ? Int64.max : use.left + plan.replacing
        let byteLimit = size == nil ? min(self.configuration.maxBlobSize, room) : nil
        var discard = plan.discard
        if let session = plan.resume, let sha1 = try? SHA1(importing: session.sha1State) {
            do {
                let staging = try await self.openStaging(session, key: key, size: size)
                if let full = self.admitSpace((size ?? 0) - session.durableOffset, upload: session.id) {
                    // Kept, with its durable bytes, for when there is room.
                    staging.close()
                    return .refuse(.storageError, full)
                }
                promised = session.id
                return .upload(session, staging, sha1, recorded: true, resumed: session.durableOffset > 0, byteLimit: byteLimit)
            } catch let error as StoreError where error.outcomeUnknown {
                // The store did not answer: the acknowledged bytes may well be there. Refused for now, kept.
                throw error
            } catch {
                // A staging that is gone or does not hold its durable bytes: start over.
                discard = session
            }
        }
        if let session = discard {
            try await store.removeStaging(session.stagingName)
            try await catalog.deleteSession(id: session.id)
        }
        let most = self.configuration.maxUnfinishedUploads
        if try await catalog.unfinishedUploads(account: name, limit: most) >= most {
            return .refuse(
                .quotaExceeded,
                "account \"\(name)\" has \(most) unfinished uploads, the most it may have: finish or cancel them (upload-agent send resumes them), or they expire"
            )
        }
        let id = Self.randomID()
        if let full = self.admitSpace(size ?? 0, upload: id) {
            return .refuse(.storageError, full)
        }
        promised = id
        let session = UploadSession(
            id: id, account: name, key: key.value, resumeToken: Self.randomBytes(), fingerprint: open.fingerprint,
            declaredSize: size, durableOffset: 0, sha1State: SHA1().exportState(), stagingName: id, declaredSHA1: open.sha1?.hex,
            striped: open.striped
        )
        let fresh = StagingRequest(name: session.stagingName, account: name, key: key, expectedSize: size, layout: .sequential(offset: 0, parts: []))
        switch plan.record {
        case .striped:
            var striped = fresh
            striped.layout = .striped(size: size ?? 0, creating: true)
            let staging = try await store.openStaging(striped)
            try await Self.record(session, staging: staging, catalog: catalog, store: store)
            return .upload(session, staging, SHA1(), recorded: true, resumed: false, byteLimit: byteLimit)
        case .atFirstSync:
            // Recorded by its first durable sync (``UploadStorage``), if any.
            let staging = try await store.openStaging(fresh)
            return .upload(session, staging, SHA1(), recorded: false, resumed: false, byteLimit: byteLimit)
        case .atOpen:
            let staging = try await store.openStaging(fresh)
            try await Self.record(session, staging: staging, catalog: catalog, store: store)
            return .upload(session, staging, SHA1(), recorded: true, resumed: false, byteLimit: byteLimit)
        }
    }

    /// Records a new session at its OPEN; when the catalog fails, its staging goes and the error is thrown.
    private static func record(_ session: UploadSession, staging: any StagingFile, catalog: any Catalog, store: any BlobStore) async throws {
        do {
            try await catalog.putSession(session)
        } catch {
            staging.close()
            try? await store.removeStaging(session.stagingName)
            throw error
        }
    }

    /// Why `bytes` more cannot be staged on the relay's disk now for the upload of session `upload` (SPEC §7), or nil
    /// once they are promised to it (until it has written them, or ends).
    private func admitSpace(_ bytes: Int64, upload: String) -> String? {
        let local = self.store.localSpace(forBlobOf: max(0, bytes))
        return self.space.admit(local.bytes, upload: upload)
    }

    /// The staging file of a session being resumed (or a PART stream's): cut to its durable offset, or, striped, as it is.
    private func openStaging(_ session: UploadSession, key: ObjectKey, size: Int64?) async throws -> any StagingFile {
        let layout: StagingRequest.Layout
        if session.striped, let size {
            layout = .striped(size: size, creating: false)
        } else {
            let parts = session.durableOffset > 0 ? try await self.catalog.stagedParts(sessionID: session.id) : []
            layout = .sequential(offset: session.durableOffset, parts: parts)
        }
        return try await self.store.openStaging(
            StagingRequest(name: session.stagingName, account: session.account, key: key, expectedSize: size, layout: layout)
        )
    }

    /// The answer to a PART (SPEC §6.7): the striped session its token names, and its staging file to write stripe
    /// `index` into; OFFSET STORED when that stripe is complete.
    private func openStripe(account: Account, open: Frame.Open, key: ObjectKey, index: Int) async throws -> OpenDecision {
        let catalog = self.catalog
        guard let size = open.size, let length = open.streamLength else {
            return .refuse(.internalError, "PART without a size")
        }
        guard let session = try await catalog.session(account: account.name, key: key.value), session.striped,
            !open.resumeToken.isEmpty, session.resumeToken == open.resumeToken, session.declaredSize == Int64(size)
        else {
            return .refuse(
                .storageError,
                "no striped upload of \"\(key)\" with this token and size \(size) is open on the relay (expired, cancelled or committed); open the blob again"
            )
        }
        if try await catalog.completeStripes(sessionID: session.id).contains(index) {
            return .stored(size: length)
        }
        // Striped, of this size (checked above): its staging as it is.
        return .stripe(session, try await self.openStaging(session, key: key, size: Int64(size)), index: index)
    }

    /// One upload's verified bytes, ready to become its object.
    struct CommitRequest: Sendable {
        var staging: any StagingFile
        var key: ObjectKey
        /// The principal the upload's connection authenticated as: the commit is refused unless it still is one.
        var account: Account
        var sessionID: String
        /// Whether the catalog holds the session (a new upload committed at once never wrote one).
        var sessionRecorded: Bool
        var size: Int64
        var sha1: SHA1Digest
        var overwrite: Bool
        /// The SHA-1 of the first 256 KiB, for a blob above that (SPEC §7.1); nil when not known.
        var probeSHA1: String? = nil
    }

    /// Verified bytes become objects (SPEC §8.3), many uploads at once (group commit): each checked, then the quota of
    /// all reserved in the catalog by one transaction, then the store's atomic renames (each directory synced once),
    /// then all recorded by one transaction. Nothing that will be refused is ever renamed into place. Each result in
    /// the order given, a refusal by ``refusal(for:doing:)``.
    func commit(_ requests: [CommitRequest]) async -> [Result<Frame.Result.Status, Refusal>] {
        let catalog = self.catalog
        var results = [Result<Frame.Result.Status, Refusal>?](repeating: nil, count: requests.count)
        func refuse(_ index: Int, _ error: any Error) {
            results[index] = .failure(Self.refusal(for: error, doing: "commit", key: requests[index].key, logger: self.logger))
        }
        var ready: [(index: Int, pending: PendingCommit)] = []
        for (index, request) in requests.enumerated() {
            do {
                if let status = try await self.settledBeforeCommit(request) {
                    results[index] = .success(status)
                } else {
                    let pending = PendingCommit(
                        account: request.account.name, key: request.key.value, size: request.size, sha1: request.sha1.hex,
                        sessionID: request.sessionID, probeSHA1: request.probeSHA1,
                        location: try self.eventLocation(request.key, account: request.account.name)
                    )
                    ready.append((index, pending))
                }
            } catch {
                refuse(index, error)
            }
        }
        var reserved: [(index: Int, pending: PendingCommit)] = []
        do {
            for (item, error) in zip(ready, try await catalog.beginCommits(ready.map(\.pending))) {
                if let error { refuse(item.index, error) } else { reserved.append(item) }
            }
        } catch {
            for item in ready { refuse(item.index, error) }
        }
        let placed = await self.store.commit(
            reserved.map {
                let request = requests[$0.index]
                return StoreCommit(
                    staging: request.staging, key: request.key, account: request.account.name, sha1: request.sha1, overwrite: request.overwrite
                )
            }
        )
        var visible: [(index: Int, pending: PendingCommit, identity: ObjectIdentity)] = []
        for (item, outcome) in zip(reserved, placed) {
            switch outcome {
            case .success(let identity):
                visible.append((item.index, item.pending, identity))
            case .failure(let error as StoreError) where error.madeVisible:
                // Visible but unrecorded: the pending commit stays for recovery to settle.
                refuse(item.index, error)
            case .failure(let error):
                try? await catalog.abandonCommit(account: item.pending.account, key: item.pending.key)
                refuse(item.index, error)
            }
        }
        do {
            // Should this record fail, recovery finds the pending commits and the objects, and settles them.
            try await catalog.finishCommits(visible.map { ($0.pending, $0.identity) })
            for item in visible { results[item.index] = .success(.stored) }
            self.eventsQueued(visible.contains { $0.pending.location != nil })
        } catch {
            for item in visible { refuse(item.index, error) }
        }
        return results.map { $0 ?? .failure(Refusal(code: .internalError, message: "commit left undecided", keepSession: true)) }
    }

    /// Where the object of `key` will be, when post-commit hooks run (the commit then queues their event); else nil.
    private func eventLocation(_ key: ObjectKey, account: String) throws -> String? {
        guard self.configuration.hooks != nil else { return nil }
        return try self.store.location(of: key, account: account)
    }

    /// Tells the hooks' runner that events wait.
    private func eventsQueued(_ queued: Bool) {
        guard queued else { return }
        self.commitEvents.signal()
    }

    /// What can be decided about a commit before any write: nil when it goes ahead; `.unchanged` when the key holds
    /// exactly these bytes already (the staged copy is dropped). Throws ``Refusal`` or the store's and catalog's errors.
    private func settledBeforeCommit(_ request: CommitRequest) async throws -> Frame.Result.Status? {
        let catalog = self.catalog
        let (account, key) = (request.account.name, request.key)
        guard try await self.currentAccount(of: request.account) != nil else {
            throw Refusal(code: .unauthenticated, message: Self.notPrincipal(account) + ": nothing was stored", keepSession: false)
        }
        let existing = try await catalog.object(account: account, key: key.value)
        if let verified = try await Self.verifiedObject(existing, store: self.store), verified.sha1 == request.sha1.hex,
            verified.size == request.size
        {
            if request.sessionRecorded { try await catalog.deleteSession(id: request.sessionID) }
            try await self.store.removeStaging(request.staging.name)
            request.staging.close()
            return .unchanged
        }
        if existing != nil && !request.overwrite {
            throw Refusal(code: .alreadyExists, message: Self.alreadyExists(key), keepSession: false)
        }
        if let conflict = try await self.store.conflict(for: key, account: account) {
            throw Refusal(code: .invalidKey, message: conflict, keepSession: false)
        }
        return nil
    }

    /// Drops the unfinished session `open` would have resumed (same resume token or fingerprint), under the key's
    /// claim, in the background: the OPEN was cancelled while it waited for its key (SPEC §3.11).
    package func discardSession(named open: Frame.Open, key: ObjectKey, account: String) {
        let claim = KeyClaims.name(account: account, key: key.value)
        guard self.claims.tryClaim(claim) else { return }
        // Closing from the start: an OPEN of the key meanwhile waits for the discard, never KEY_BUSY.
        self.claims.markClosing(claim)
        let (claims, catalog, store) = (self.claims, self.catalog, self.store)
        self.executor.task {
            defer { claims.release(claim) }
            guard (try? await claims.lockAcrossRelays(account: account, key: key.value)) == true,
                let session = try? await catalog.session(account: account, key: key.value)
            else { return }
            let byToken = !open.resumeToken.isEmpty && open.resumeToken == session.resumeToken
            let byFingerprint = !open.fingerprint.isEmpty && open.fingerprint == session.fingerprint
            guard byToken || byFingerprint else { return }
            try? await store.removeStaging(session.stagingName)
            try? await catalog.deleteSession(id: session.id)
        }
    }

    /// The account as the catalog holds it now, when the connection that authenticated as `principal` may still act for
    /// it (SPEC §2.3): nil once it was disabled, rotated, or deleted (a name given again is another token).
    func currentAccount(of principal: Account) async throws -> Account? {
        guard let current = try await self.catalog.account(named: principal.name), current.isPrincipal(principal) else { return nil }
        return current
    }

    /// Why a connection may no longer act for `account`: its token is not the account's valid token any more.
    static func notPrincipal(_ account: String) -> String {
        "the token of account \"\(account)\" is no longer valid (revoked, replaced by token rotate, or its account deleted)"
    }

    static func alreadyExists(_ key: ObjectKey) -> String {
        "key \"\(key)\" holds other content; ask to overwrite (--overwrite) or choose another key"
    }

    /// 16 random bytes as 32 hex digits.
    package static func randomID() -> String {
        Self.randomBytes().map { $0 < 16 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined()
    }

    /// 16 bytes from the system's generator, in two draws (not one system call per byte).
    package static func randomBytes() -> [UInt8] {
        var generator = SystemRandomNumberGenerator()
        return [generator.next(), generator.next()].flatMap { (word: UInt64) in withUnsafeBytes(of: word) { Array($0) } }
    }
}
