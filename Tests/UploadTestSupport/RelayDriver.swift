import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import UploadChecksums
import UploadProtocol

import UploadRelay
import UploadRelayLocalStore
import UploadRelaySQLite

/// What the connections of one in-memory relay share: the relay's own catalog (SQLite), store (a local directory) and
/// budgets, in a temporary directory removed at exit. Nothing here is a stand-in: only sockets and threads are missing.
public final class RelayBackend: Sendable {
    public let directory: String
    public let relay: Relay

    /// A relay whose accounts are `tokens` (token → account name), with its configuration adjusted by `configure`.
    public init(tokens: [String: String] = ["good-token": "cam-7"], configure: (inout RelayConfiguration) -> Void = { _ in }) async throws {
        self.directory = TemporaryDirectories.make(prefix: "upload-relay-driver-")
        var configuration = RelayConfiguration(certificatePath: "-", privateKeyPath: "-", dataDirectory: self.directory)
        configuration.maxOpenUploads = 1024
        configure(&configuration)
        let catalog = try SQLiteCatalog(path: configuration.catalogPath)
        for (token, account) in tokens.sorted(by: { $0.key < $1.key }) where try await catalog.account(named: account) == nil {
            try await catalog.addAccount(name: account, tokenHash: Tokens.hash(Array(token.utf8)), quota: nil)
        }
        let store = try LocalDirectoryStore(root: configuration.storePath, stagingDirectory: configuration.stagingDirectory, directBuffer: 0)
        self.relay = Relay(
            configuration: configuration, catalog: catalog, store: store, threadPool: .singleton, logger: Logger(label: "relay-driver")
        )
    }

    /// The committed object of `key`, read from the store; nil when there is none.
    public func object(_ key: String, account: String = "cam-7") async -> [UInt8]? {
        guard (try? await self.relay.catalog.object(account: account, key: key)) != nil else { return nil }
        return FileManager.default.contents(atPath: "\(self.relay.configuration.storePath)/\(account)/\(key)").map { Array($0) }
    }

    /// The keys of every committed object of `account`, sorted.
    public func objectKeys(account: String = "cam-7") async -> [String] {
        ((try? await self.relay.catalog.objects()) ?? []).filter { $0.account == account }.map(\.key).sorted()
    }

    /// The durable offset of the unfinished upload of `key`; nil when there is none.
    public func durableOffset(_ key: String, account: String = "cam-7") async -> Int64? {
        (try? await self.relay.catalog.session(account: account, key: key))??.durableOffset
    }

    /// Whether any key is claimed, any upload slot taken or any memory held: after every connection closed and its
    /// storage let go, none may be.
    public var holdsResources: Bool {
        self.relay.uploadSlots.inUse != 0 || self.relay.memory.inUse != 0 || self.relay.claims.count != 0
    }
}

/// One relay connection without a socket: the relay's real ``RelaySession`` fed bytes, its actions run in line against a
/// ``RelayBackend``. Storage steps run when the test says (``storageAtOnce``, or ``runStorage(limit:)`` for a slow disk);
/// timers fire when the test moves the clock (``advance(by:)``).
public struct RelayDriver {
    public let backend: RelayBackend
    var session: RelaySession
    /// The clock of this connection, moved only by ``advance(by:)``.
    public private(set) var now = NIODeadline.uptimeNanoseconds(1_000_000_000)
    /// When false, storage steps wait in line until ``runStorage(limit:)``: a slow disk.
    public var storageAtOnce = true
    /// Storage steps not yet run, in the order the session asked for them.
    var pendingStorage: [(StreamID, UploadPipeline.StorageStep)] = []
    var storages: [StreamID: UploadStorage] = [:]
    var timers: [RelaySession.Timer: NIODeadline] = [:]
    /// Every log line the session asked for.
    public private(set) var logs: [String] = []
    /// Whether the session closed the connection.
    public private(set) var closed = false
    /// OPENs that waited for their key, woken by the key claims (from any thread).
    private let woken: WokenOpens

    public init(backend: RelayBackend) {
        // If this init crashes in "outlined destroy of RelayDriver" after a type of UploadRelay changed its layout, the
        // incremental debug build left this module stale: remove .build/debug/UploadTestSupport.build and build again.
        let woken = WokenOpens()
        let now = NIODeadline.uptimeNanoseconds(1_000_000_000)
        self.backend = backend
        self.woken = woken
        self.now = now
        self.session = RelaySession(resources: backend.relay.connectionDependencies.resources, now: now) { open, key in
            woken.append(open, key)
        }
    }

    /// The connection's protocol state machine, for assertions.
    public var machine: RelayConnectionStateMachine { self.session.machine }

    /// Storage steps waiting to run.
    public var pendingStorageCount: Int { self.pendingStorage.count }

    /// The connection is accepted and TLS chose the protocol's ALPN id.
    public mutating func start() async -> [Frame] {
        var out: [Frame] = []
        await self.run(self.session.started(now: self.now), into: &out)
        await self.run(self.session.tlsHandshakeCompleted(alpn: ProtocolLimits.alpn, now: self.now), into: &out)
        await self.settle(into: &out)
        return out
    }

    /// Bytes from the agent: every whole frame is handled, and the frames the relay writes are returned.
    public mutating func receive(_ bytes: inout ByteBuffer) async -> [Frame] {
        var out: [Frame] = []
        self.session.received(bytes)
        bytes.moveReaderIndex(to: bytes.writerIndex)
        while let actions = self.session.nextFrame(now: self.now) {
            await self.run(actions, into: &out)
        }
        await self.run(self.session.readingPaused(now: self.now), into: &out)
        await self.settle(into: &out)
        return out
    }

    /// Runs up to `limit` waiting storage steps, in order; the frames the relay writes.
    public mutating func runStorage(limit: Int = .max) async -> [Frame] {
        var out: [Frame] = []
        var ran = 0
        while ran < limit, !self.pendingStorage.isEmpty {
            let (id, step) = self.pendingStorage.removeFirst()
            await self.perform(step, of: id, into: &out)
            ran += 1
        }
        await self.settle(into: &out)
        return out
    }

    /// Moves the clock and fires every timer due by then, earliest first.
    public mutating func advance(by amount: TimeAmount) async -> [Frame] {
        self.now = self.now + amount
        var out: [Frame] = []
        while let (timer, _) = self.timers.filter({ $0.value <= self.now }).min(by: { $0.value < $1.value }) {
            self.timers[timer] = nil
            await self.run(self.session.timerFired(timer, now: self.now), into: &out)
        }
        await self.settle(into: &out)
        return out
    }

    /// Graceful shutdown (SPEC §6.5): GOAWAY, then the drain.
    public mutating func shutdown() async -> [Frame] {
        var out: [Frame] = []
        await self.run(self.session.shutdown(), into: &out)
        await self.settle(into: &out)
        return out
    }

    /// The agent's side of the connection is gone (or the relay closed it).
    public mutating func connectionClosed() async {
        var out: [Frame] = []
        await self.run(self.session.connectionClosed(), into: &out)
        self.closed = true
        // Storage finishes after the connection has gone, as on the thread pool.
        let atOnce = self.storageAtOnce
        self.storageAtOnce = true
        await self.settle(into: &out)
        self.storageAtOnce = atOnce
    }

    // MARK: Running actions, as RelayConnectionHandler does

    mutating func run(_ actions: [RelaySession.Action], into out: inout [Frame]) async {
        for action in actions {
            switch action {
            case .write(let frame):
                out.append(frame)
            case .close:
                self.closed = true
            case .schedule(let timer, let delay):
                self.timers[timer] = self.now + delay
            case .cancel(let timer):
                self.timers[timer] = nil
            case .authenticate(let hello):
                let result: Result<Account?, any Error>
                do {
                    result = .success(try await self.backend.relay.catalog.account(tokenHash: Tokens.hash(hello.credential)))
                } catch {
                    result = .failure(error)
                }
                await self.run(self.session.authenticated(result), into: &out)
            case .lookUp(let open, let key, let account):
                let (decision, storage) = await RelayWork.lookUp(
                    open, key, account, policy: self.backend.relay.policy, storage: self.backend.relay.connectionDependencies.storage,
                    logger: self.backend.relay.logger)
                self.storages[open.streamID] = storage
                await self.run(self.session.uploadLookedUp(open.streamID, decision, key: key), into: &out)
            case .storage(let id, let step):
                self.pendingStorage.append((id, step))
            case .dropStorage(let id):
                self.storages[id] = nil
            case .plan(let plan, let account):
                let answer = await self.backend.relay.policy.plan(account: account, plan: plan)
                await self.run(self.session.planAnswered(answer), into: &out)
            case .discardSession(let open, let key, let account):
                self.backend.relay.policy.discardSession(named: open, key: key, account: account.name)
            case .log(_, let message, let metadata):
                self.logs.append(metadata.isEmpty ? message : "\(message) \(metadata)")
            }
        }
    }

    mutating func perform(_ step: UploadPipeline.StorageStep, of id: StreamID, into out: inout [Frame]) async {
        guard let storage = self.storages[id] else { return }
        if case .release = step { self.storages[id] = nil }
        // A commit completes once its group is durable: wait for it, as the handler's event loop would.
        let completion = await storage.perform(step)
        await self.run(self.session.storageFinished(id, completion), into: &out)
    }

    /// What happens after an input's actions ran: OPENs whose key was freed run again and, with ``storageAtOnce``,
    /// storage steps run (and those their completions ask for) until none is left.
    mutating func settle(into out: inout [Frame]) async {
        while true {
            let woken = self.woken.take()
            for (open, key) in woken {
                await self.run(self.session.openUpload(open, key), into: &out)
            }
            guard self.storageAtOnce, !self.pendingStorage.isEmpty else {
                if woken.isEmpty { return }
                continue
            }
            let (id, step) = self.pendingStorage.removeFirst()
            await self.perform(step, of: id, into: &out)
        }
    }
}

/// OPENs woken by the key claims, which call from whichever thread released the key.
private final class WokenOpens: Sendable {
    private let opens = NIOLockedValueBox<[(Frame.Open, ObjectKey)]>([])
    func append(_ open: Frame.Open, _ key: ObjectKey) { self.opens.withLockedValue { $0.append((open, key)) } }
    func take() -> [(Frame.Open, ObjectKey)] {
        self.opens.withLockedValue { opens in
            defer { opens = [] }; return opens
        }
    }
}
