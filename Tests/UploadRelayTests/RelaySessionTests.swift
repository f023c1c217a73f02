import NIOConcurrencyHelpers
import NIOCore
import Testing
import UploadProtocol
import UploadTestSupport

@testable import UploadRelay

/// A relay session driven by hand: frames in as bytes, actions out, time passed in. No socket, no thread, no store.
struct SessionHarness {
    var session: RelaySession
    let resources: RelaySessionResources
    var now = NIODeadline.uptimeNanoseconds(1_000_000_000)
    /// OPENs the key claims woke up.
    let woken = NIOLockedValueBox<[Frame.Open]>([])
    /// Every action so far.
    var log: [RelaySession.Action] = []

    init(configure: (inout RelayConfiguration) -> Void = { _ in }, claims: KeyClaims = KeyClaims(), memory: ResourceBudget? = nil, slots: Int = 100) {
        var configuration = RelayConfiguration(certificatePath: "-", privateKeyPath: "-", dataDirectory: "/nonexistent")
        configure(&configuration)
        self.resources = RelaySessionResources(
            configuration: configuration, claims: claims, memory: memory ?? ResourceBudget(total: configuration.memoryBudget),
            uploadSlots: UploadSlots(total: slots, floor: configuration.limits.maxConcurrentStreams)
        )
        let woken = self.woken
        self.session = RelaySession(resources: self.resources, now: self.now) { open, _ in woken.withLockedValue { $0.append(open) } }
    }

    mutating func take(_ actions: [RelaySession.Action]) -> [RelaySession.Action] {
        self.log += actions
        return actions
    }

    /// Sends frames as bytes, decodes and runs them all.
    @discardableResult
    mutating func send(_ frames: Frame...) -> [RelaySession.Action] {
        var bytes = ByteBuffer()
        for frame in frames { bytes.writeImmutableBuffer(FrameEncoder.encodeToBuffer(frame)) }
        self.session.received(bytes)
        var actions: [RelaySession.Action] = []
        while let more = self.session.nextFrame(now: self.now) { actions += more }
        actions += self.session.readingPaused(now: self.now)
        return self.take(actions)
    }

    /// TLS up, HELLO, catalog says `account`: the connection is ready.
    mutating func handshake(account: String = "a", tokenHash: [UInt8] = [1]) {
        _ = self.take(self.session.started(now: self.now))
        _ = self.take(self.session.tlsHandshakeCompleted(alpn: ProtocolLimits.alpn, now: self.now))
        self.send(.hello(Frame.Hello(maxFrameSize: 65_536, features: [], credential: [1], agentName: "t")))
        _ = self.take(self.session.authenticated(.success(Account(name: account, quota: nil, tokenHash: tokenHash))))
    }

    static func frames(_ actions: [RelaySession.Action]) -> [Frame] {
        actions.compactMap { if case .write(let frame) = $0 { return frame } else { return nil } }
    }

    static func steps(_ actions: [RelaySession.Action]) -> [(StreamID, UploadPipeline.StorageStep)] {
        actions.compactMap { if case .storage(let id, let step) = $0 { return (id, step) } else { return nil } }
    }

    static func closes(_ actions: [RelaySession.Action]) -> Bool {
        actions.contains { if case .close = $0 { return true } else { return false } }
    }

    static func errors(_ actions: [RelaySession.Action]) -> [Frame.Error] {
        Self.frames(actions).compactMap { if case .error(let e) = $0 { return e } else { return nil } }
    }
}

@Suite("Relay session: connection decisions without sockets")
struct RelaySessionTests {
    static let s1 = StreamID(rawValue: 1)
    static let s3 = StreamID(rawValue: 3)

    static func open(_ id: StreamID, _ key: String, size: UInt64? = 10) -> Frame {
        .open(Frame.Open(streamID: id, key: key, size: size))
    }

    static func chunk(_ id: StreamID, at offset: UInt64, _ count: Int) -> Frame {
        .chunk(Frame.Chunk(streamID: id, offset: offset, crc32: 0, data: ByteBuffer(bytes: [UInt8](repeating: 1, count: count))))
    }

    @Test("nothing is read before TLS selects the protocol; a connection without it closes unanswered")
    func alpnGate() async {
        var h = SessionHarness()
        let started = h.take(h.session.started(now: h.now))
        #expect(started.contains { if case .schedule(.handshake, _) = $0 { return true } else { return false } })
        #expect(h.send(.hello(Frame.Hello(maxFrameSize: 65_536, features: [], credential: [1], agentName: "t"))).isEmpty)
        let refused = h.take(h.session.tlsHandshakeCompleted(alpn: "h2", now: h.now))
        #expect(SessionHarness.closes(refused))
        #expect(SessionHarness.frames(refused).isEmpty)
    }

    @Test("HELLO is authenticated, WELCOME takes a share of the memory budget, and the frame limit rises only then")
    func handshake() async {
        let memory = ResourceBudget(total: 1 << 30)
        var h = SessionHarness(memory: memory)
        _ = h.take(h.session.started(now: h.now))
        _ = h.take(h.session.tlsHandshakeCompleted(alpn: ProtocolLimits.alpn, now: h.now))
        let hello = h.send(.hello(Frame.Hello(maxFrameSize: 65_536, features: [], credential: [1], agentName: "t")))
        #expect(hello.contains { if case .authenticate = $0 { return true } else { return false } })
        #expect(h.session.machine.inboundFrameLimit == ProtocolLimits.initialMaxFrameSize)
        let welcome = h.take(h.session.authenticated(.success(Account(name: "a", quota: nil))))
        #expect(SessionHarness.frames(welcome).contains { $0.type == .welcome })
        #expect(welcome.contains { if case .cancel(.handshake) = $0 { return true } else { return false } })
        #expect(h.session.machine.inboundFrameLimit == h.resources.settings.limits.maxFrameSize)
        #expect(memory.inUse == h.resources.settings.limits.connectionWindow)
        _ = h.take(h.session.connectionClosed())
        #expect(memory.inUse == 0)
    }

    @Test("an unknown token, a revoked one, and a handshake that takes too long each close with their own error")
    func handshakeFailures() async {
        for outcome in 0..<3 {
            var h = SessionHarness()
            _ = h.take(h.session.started(now: h.now))
            _ = h.take(h.session.tlsHandshakeCompleted(alpn: ProtocolLimits.alpn, now: h.now))
            h.send(.hello(Frame.Hello(maxFrameSize: 65_536, features: [], credential: [1], agentName: "t")))
            let actions: [RelaySession.Action]
            switch outcome {
            case 0: actions = h.session.authenticated(.success(nil))
            case 1: actions = h.session.authenticated(.success(Account(name: "a", quota: nil, revoked: true)))
            default: actions = h.session.timerFired(.handshake, now: h.now + .seconds(30))
            }
            let error = SessionHarness.errors(actions).first
            #expect(error?.code == (outcome == 2 ? .timeout : .unauthenticated))
            #expect(error?.streamID == .connection)
            #expect(SessionHarness.closes(actions))
        }
    }

    @Test("an upload end to end: key claimed, slot taken, OFFSET, storage steps, credit, ACK, RESULT; all given back")
    func uploadFlow() async {
        var h = SessionHarness()
        h.handshake()
        let opened = h.send(Self.open(Self.s1, "k"))
        #expect(opened.contains { if case .lookUp = $0 { return true } else { return false } })
        #expect(h.resources.claims.count == 1 && h.resources.uploadSlots.inUse == 1)
        let offset = h.take(
            h.session.uploadLookedUp(
                Self.s1, .upload(durableOffset: 0, resumeToken: [9], resumed: false, byteLimit: nil), key: try! ObjectKey(validating: "k")))
        #expect(SessionHarness.frames(offset).first?.type == .offset)
        let write = SessionHarness.steps(h.send(Self.chunk(Self.s1, at: 0, 10)))
        #expect(write.count == 1)
        let wrote = h.take(h.session.storageFinished(Self.s1, .wrote(consumed: [10], error: nil)))
        #expect(wrote.contains { if case .schedule(.sync(Self.s1), _) = $0 { return true } else { return false } })
        let hashed = SessionHarness.steps(h.send(.hash(Frame.Hash(streamID: Self.s1, size: 10, sha1: SHA1Digest.empty))))
        // The commit makes the bytes durable itself: no sync first, and the sync timer is cancelled.
        #expect(hashed.map(\.1) == [.commit(Frame.Hash(streamID: Self.s1, size: 10, sha1: SHA1Digest.empty), written: 10)])
        let committed = h.take(h.session.storageFinished(Self.s1, .committed(.success(.stored))))
        #expect(SessionHarness.frames(committed).contains { $0.type == .result })
        #expect(
            committed.contains { if case .dropStorage(Self.s1) = $0 { return true } else { return false } }, "the handler lets go of the executor")
        #expect(h.resources.claims.count == 0 && h.resources.uploadSlots.inUse == 0)
        #expect(h.session.pipelines.isEmpty)
    }

    @Test(
        "lookups of one connection run 2 at a time: the others wait in order; a CANCEL while one waits drops its session when its lookup returns; every claim and slot goes back"
    )
    func lookupsBounded() async throws {
        var h = SessionHarness(configure: { $0.lookupsPerConnection = 2 })
        h.handshake()
        func lookups(_ actions: [RelaySession.Action]) -> [StreamID] {
            actions.compactMap { if case .lookUp(let open, _, _) = $0 { return open.streamID } else { return nil } }
        }
        var started: [StreamID] = []
        for i in 0..<5 { started += lookups(h.send(Self.open(StreamID(rawValue: UInt32(2 * i + 1)), "k\(i)"))) }
        #expect(started == [1, 3], "two at once")
        #expect(h.resources.claims.count == 5 && h.resources.uploadSlots.inUse == 5, "every OPEN holds its key and slot while it waits")
        h.send(.cancel(Frame.Cancel(streamID: 7, code: .cancelled, message: "stop")))
        let key = try ObjectKey(validating: "k")
        var next = lookups(h.take(h.session.uploadLookedUp(1, .stored(size: 0), key: key)))
        #expect(next == [5], "the first waiting one, in order")
        next = lookups(h.take(h.session.uploadLookedUp(3, .stored(size: 0), key: key)))
        #expect(next == [7])
        next = lookups(h.take(h.session.uploadLookedUp(5, .stored(size: 0), key: key)))
        #expect(next == [9])
        let cancelled = h.take(
            h.session.uploadLookedUp(7, .upload(durableOffset: 0, resumeToken: [9], resumed: false, byteLimit: nil), key: key))
        #expect(SessionHarness.steps(cancelled).map(\.1) == [.release(discardSession: true)], "cancelled while it waited: dropped")
        #expect(lookups(cancelled).isEmpty)
        _ = h.take(h.session.uploadLookedUp(9, .stored(size: 0), key: key))
        _ = h.take(h.session.storageFinished(7, .released))
        #expect(h.session.lookupsInFlight == 0 && h.session.lookupQueue.isEmpty && h.session.opening.isEmpty)
        #expect(h.resources.claims.count == 0 && h.resources.uploadSlots.inUse == 0, "every claim and slot given back")
    }

    @Test("CANCEL during the lookup, then the connection closes: the session is still dropped when the lookup returns")
    func cancelThenCloseWhileLookingUp() async throws {
        var h = SessionHarness()
        h.handshake()
        h.send(Self.open(Self.s1, "k"))
        h.send(.cancel(Frame.Cancel(streamID: Self.s1, code: .cancelled, message: "stop")))
        _ = h.take(h.session.connectionClosed())
        let looked = h.take(
            h.session.uploadLookedUp(
                Self.s1, .upload(durableOffset: 0, resumeToken: [9], resumed: false, byteLimit: nil), key: try ObjectKey(validating: "k")))
        #expect(SessionHarness.steps(looked).map(\.1) == [.release(discardSession: true)])
        #expect(SessionHarness.frames(looked).isEmpty)
    }

    @Test(
        "a connection that only PINGs for 5 s, holding more than its share while others wait at the floor, is asked to go, also with an upload open; one whose OPEN is looked up, or below its share, is not"
    )
    func idleShareGoesBack() async throws {
        let memory = ResourceBudget(total: 4 << 20)
        let windows: (inout RelayConfiguration) -> Void = {
            $0.memoryBudget = 4 << 20
            $0.limits.connectionWindow = 1 << 20
        }
        var hogs = (0..<4).map { _ in SessionHarness(configure: windows, memory: memory) }
        for index in hogs.indices { hogs[index].handshake(account: "hog") }
        var waiting = SessionHarness(configure: windows, memory: memory)
        waiting.handshake(account: "b")
        #expect(waiting.session.grantedWindow < 1 << 20, "the budget is taken: the floor")
        // A second one at the floor keeps the budget short after one hog has gone.
        var waitingToo = SessionHarness(configure: windows, memory: memory)
        waitingToo.handshake(account: "b")
        let accounts = ["hog": Account(name: "hog", quota: nil, tokenHash: [1]), "b": Account(name: "b", quota: nil, tokenHash: [1])]
        // 4 s of PINGs: not yet.
        let early = hogs[0].now + .seconds(4)
        hogs[0].now = early
        hogs[0].send(.ping(Frame.Ping(data: 7)))
        #expect(!SessionHarness.closes(hogs[0].session.accountsLooked(accounts, now: early)))
        // A hog whose OPEN the relay is still looking up is busy, whatever the time.
        hogs[1].send(Self.open(Self.s1, "k"))
        #expect(hogs[1].session.accountsLooked(accounts, now: hogs[1].now + .seconds(60)).isEmpty)
        // Looked up, it holds credit and sends nothing but PINGs: idle too, asked to go; what arrived is acknowledged.
        _ = hogs[1].take(
            hogs[1].session.uploadLookedUp(
                Self.s1, .upload(durableOffset: 0, resumeToken: [], resumed: false, byteLimit: nil), key: try ObjectKey(validating: "k")))
        hogs[1].send(.ping(Frame.Ping(data: 8)))
        #expect(hogs[1].session.accountsLooked(accounts, now: hogs[1].now + .seconds(64)).isEmpty, "4 s after its last look")
        let openIdle = hogs[1].take(hogs[1].session.accountsLooked(accounts, now: hogs[1].now + .seconds(65)))
        #expect(SessionHarness.frames(openIdle).contains { if case .goAway = $0 { return true } else { return false } }, "\(openIdle)")
        if !SessionHarness.closes(openIdle) {
            let synced = hogs[1].take(hogs[1].session.storageFinished(Self.s1, .synced(.success(0))))
            #expect(SessionHarness.closes(synced), "closed once durable, without the drain period: \(synced)")
        }
        _ = hogs[1].session.connectionClosed()
        // Idle past 5 s: GOAWAY, closed, its share back at once.
        let late = hogs[2].now + .seconds(5)
        let asked = hogs[2].session.accountsLooked(accounts, now: late)
        #expect(SessionHarness.frames(asked).contains { if case .goAway(let g) = $0 { return g.code == .noError } else { return false } }, "\(asked)")
        #expect(SessionHarness.closes(asked))
        #expect(memory.free >= (1 << 20) - waiting.session.grantedWindow, "the share went back before TLS closed")
        #expect(hogs[2].session.grantedWindow == 0)
        _ = hogs[2].session.connectionClosed()
        // The budget can give each connection left a whole window now: the next idle hog stays.
        #expect(!SessionHarness.closes(hogs[3].session.accountsLooked(accounts, now: hogs[3].now + .seconds(60))))
    }

    @Test("a second OPEN of an open key is KEY_BUSY; of a closing key it waits and is woken when the key is free")
    func keyClaims() async throws {
        let claims = KeyClaims()
        var first = SessionHarness(claims: claims)
        var second = SessionHarness(claims: claims)
        first.handshake()
        second.handshake()
        first.send(Self.open(Self.s1, "k"))
        let busy = SessionHarness.errors(second.send(Self.open(Self.s1, "k")))
        #expect(busy.map(\.code) == [.keyBusy])
        // The first stream ends on the wire while it is looked up: its key is closing.
        first.send(.cancel(Frame.Cancel(streamID: Self.s1, message: "stop")))
        #expect(second.send(Self.open(Self.s3, "k")).isEmpty, "waits, no KEY_BUSY")
        let looked = first.take(
            first.session.uploadLookedUp(
                Self.s1, .upload(durableOffset: 0, resumeToken: [], resumed: false, byteLimit: nil), key: try ObjectKey(validating: "k")))
        #expect(SessionHarness.steps(looked).map(\.1) == [.release(discardSession: true)], "CANCEL drops the session")
        #expect(SessionHarness.frames(looked).isEmpty)
        // The handler's release step gives the key back; the waiting OPEN is woken.
        first.resources.uploadSlots.give(for: "a")
        claims.release(KeyClaims.name(account: "a", key: "k"))
        #expect(second.woken.withLockedValue { $0.map(\.streamID) } == [Self.s3])
    }

    @Test("a frame trickled byte by byte is cut off by the frame timeout, also with the idle timeout off", arguments: [Duration.seconds(120), .zero])
    func frameTimeout(idle: Duration) async {
        var h = SessionHarness {
            $0.limits.frameTimeout = .seconds(5)
            $0.limits.idleTimeout = idle
        }
        h.handshake()
        var bytes = FrameEncoder.encodeToBuffer(Self.open(Self.s1, "k"))
        h.session.received(bytes.readSlice(length: 3)!)
        #expect(h.session.nextFrame(now: h.now) == nil)
        let paused = h.take(h.session.readingPaused(now: h.now))
        #expect(paused.contains { if case .schedule(.liveness, let delay) = $0 { return delay <= .seconds(5) } else { return false } })
        let fired = h.take(h.session.timerFired(.liveness, now: h.now + .seconds(5)))
        #expect(SessionHarness.errors(fired).map(\.code) == [.timeout])
        #expect(SessionHarness.closes(fired))
    }

    @Test("GOAWAY drains: open uploads go on; after the drain period they are made durable, then the connection closes")
    func shutdownDrain() async throws {
        var h = SessionHarness()
        h.handshake()
        h.send(Self.open(Self.s1, "k"))
        _ = h.take(
            h.session.uploadLookedUp(
                Self.s1, .upload(durableOffset: 0, resumeToken: [], resumed: false, byteLimit: nil), key: try ObjectKey(validating: "k")))
        h.send(Self.chunk(Self.s1, at: 0, 4))
        _ = h.take(h.session.storageFinished(Self.s1, .wrote(consumed: [4], error: nil)))
        let goAway = h.take(h.session.shutdown())
        #expect(SessionHarness.frames(goAway).map(\.type) == [.goAway])
        #expect(!SessionHarness.closes(goAway))
        let finishing = h.take(h.session.timerFired(.grace, now: h.now + .seconds(10)))
        #expect(SessionHarness.steps(finishing).map(\.1) == [.sync(through: 4)])
        #expect(!SessionHarness.closes(finishing))
        let synced = h.take(h.session.storageFinished(Self.s1, .synced(.success(4))))
        #expect(SessionHarness.frames(synced).map(\.type) == [.ack])
        #expect(SessionHarness.closes(synced), "every open upload is durable: close")
    }

    @Test(
        "a connection closes with UNAUTHENTICATED once its principal is gone (revoked, rotated, deleted, deleted and made again); others' do not"
    )
    func principalGone() async {
        let a = Account(name: "a", quota: nil, tokenHash: [1])
        let b = Account(name: "b", quota: nil, tokenHash: [9])
        var rotated = a
        rotated.tokenHash = [2]
        var revoked = a
        revoked.revoked = true
        let cases: [(String, [String: Account], String)] = [
            ("revoked", ["a": revoked, "b": b], "revoked"),
            ("rotated", ["a": rotated, "b": b], "token rotate"),
            ("deleted", ["b": b], "deleted"),
            // Deleted and `token add` of the same name before the next look: another token, so another principal.
            ("made again", ["a": rotated, "b": b], "token rotate"),
        ]
        for (what, accounts, words) in cases {
            var h = SessionHarness()
            h.handshake(account: "a", tokenHash: [1])
            #expect(h.session.accountsLooked(["a": a, "b": b], now: h.now).isEmpty, "\(what): unchanged")
            #expect(h.session.accountsLooked(["a": a], now: h.now).isEmpty, "\(what): another account's deletion")
            let closed = h.session.accountsLooked(accounts, now: h.now)
            #expect(SessionHarness.errors(closed).map(\.code) == [.unauthenticated], "\(what)")
            #expect(SessionHarness.errors(closed).first?.message.contains(words) == true, "\(what)")
        }
        var renewed = SessionHarness()
        renewed.handshake(account: "a", tokenHash: [2])
        #expect(renewed.session.accountsLooked(["a": rotated], now: renewed.now).isEmpty)
        // Before authentication there is no principal to lose.
        var fresh = SessionHarness()
        #expect(fresh.session.accountsLooked([:], now: fresh.now).isEmpty)
    }

    /// Seeded: streams opened, fed, cancelled and completed in random orders, the link cut at a random point; at the
    /// end every key claim, upload slot and byte of the memory budget is back.
    @Test("random orders of frames and completions leave no claim, slot or memory behind", arguments: 0..<30)
    func randomOrders(round: Int) async throws {
        let seed = UInt64(0xC1A1_0000) + UInt64(round)
        var rng = SeededGenerator(seed: seed)
        let claims = KeyClaims()
        let memory = ResourceBudget(total: 1 << 30)
        var h = SessionHarness(
            configure: {
                $0.syncBytes = Int.random(in: 1...64, using: &rng)
                $0.lookupsPerConnection = Int.random(in: 1...3, using: &rng)
            }, claims: claims, memory: memory,
            slots: Int.random(in: 1...4, using: &rng))
        h.handshake()
        var nextID: UInt32 = 1
        var sent: [StreamID: UInt64] = [:]
        var lookups: [StreamID] = []
        var work: [StreamID: UploadPipeline.StorageStep] = [:]
        var released: [StreamID] = []
        var keys: [StreamID: String] = [:]
        func absorb(_ actions: [RelaySession.Action]) {
            for case .lookUp(let open, _, _) in actions { lookups.append(open.streamID) }
            for (id, step) in SessionHarness.steps(actions) {
                if case .release = step {
                    released.append(id)
                } else {
                    #expect(work[id] == nil, "seed \(seed): two storage steps at once on \(id)")
                    work[id] = step
                }
            }
        }
        for _ in 0..<150 where !h.session.closed {
            switch Int.random(in: 0..<9, using: &rng) {
            case 0:
                let id = StreamID(rawValue: nextID)
                nextID += 2
                keys[id] = "k\(Int.random(in: 0..<3, using: &rng))"
                absorb(h.send(Self.open(id, keys[id]!, size: nil)))
            case 1 where !lookups.isEmpty:
                let id = lookups.remove(at: Int.random(in: 0..<lookups.count, using: &rng))
                let decision: RelaySession.LookUp =
                    Bool.random(using: &rng) ? .upload(durableOffset: 0, resumeToken: [], resumed: false, byteLimit: nil) : .stored(size: 0)
                absorb(h.take(h.session.uploadLookedUp(id, decision, key: try ObjectKey(validating: "k"))))
            case 2, 3:
                guard let id = h.session.pipelines.keys.filter({ h.session.pipelines[$0]!.isOpen }).randomElement(using: &rng) else { continue }
                let n = Int.random(in: 1...20, using: &rng)
                absorb(h.send(Self.chunk(id, at: sent[id, default: 0], n)))
                sent[id, default: 0] += UInt64(n)
            case 4 where Int.random(in: 0..<3, using: &rng) == 0:
                guard let id = h.session.pipelines.keys.randomElement(using: &rng) else { continue }
                absorb(h.send(.hash(Frame.Hash(streamID: id, size: sent[id, default: 0], sha1: SHA1Digest.empty))))
            case 5 where Int.random(in: 0..<4, using: &rng) == 0:
                guard let id = keys.keys.randomElement(using: &rng) else { continue }
                absorb(h.send(.cancel(Frame.Cancel(streamID: id, message: "x"))))
            default:
                guard let (id, step) = work.randomElement(using: &rng) else { continue }
                work[id] = nil
                let completion: RelaySession.StorageCompletion
                switch step {
                case .write(let chunks, _): completion = .wrote(consumed: chunks.map(\.payloadLength), error: nil)
                case .sync(let offset): completion = .synced(.success(offset))
                default:
                    completion = .committed(
                        Bool.random(using: &rng)
                            ? .success(.stored) : .failure(UploadPolicy.Refusal(code: .alreadyExists, message: "x", keepSession: false)))
                }
                absorb(h.take(h.session.storageFinished(id, completion)))
            }
        }
        // The link goes; lookups return and storage finishes.
        absorb(h.take(h.session.connectionClosed()))
        // Each lookup that returns may start a queued one.
        while !lookups.isEmpty {
            let id = lookups.removeFirst()
            absorb(
                h.take(
                    h.session.uploadLookedUp(
                        id, .upload(durableOffset: 0, resumeToken: [], resumed: false, byteLimit: nil), key: try ObjectKey(validating: "k"))))
        }
        while let (id, step) = work.first {
            work[id] = nil
            switch step {
            case .write(let chunks, _): absorb(h.take(h.session.storageFinished(id, .wrote(consumed: chunks.map(\.payloadLength), error: nil))))
            case .sync(let offset): absorb(h.take(h.session.storageFinished(id, .synced(.success(offset)))))
            default: absorb(h.take(h.session.storageFinished(id, .committed(.success(.stored)))))
            }
        }
        // The handler's release steps give each slot and key back.
        for id in released {
            h.resources.uploadSlots.give(for: "a")
            claims.release(KeyClaims.name(account: "a", key: keys[id] ?? ""))
        }
        #expect(h.session.pipelines.isEmpty, "seed \(seed): pipelines left: \(h.session.pipelines.keys.sorted())")
        #expect(h.resources.uploadSlots.inUse == 0, "seed \(seed): \(h.resources.uploadSlots.inUse) upload slots not given back")
        #expect(memory.inUse == 0, "seed \(seed): memory budget not given back")
        #expect(Set(released).count == released.count, "seed \(seed): a stream released twice")
        #expect(claims.count == 0, "seed \(seed): \(claims.count) key claims not given back")
    }
}
