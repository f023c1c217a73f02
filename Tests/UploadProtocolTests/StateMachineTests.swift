import NIOCore
import Testing
@testable import UploadProtocol
import UploadTestSupport

@Suite("State machines, one at a time")
struct StateMachineTests {
    static func readyRelay(limits: ProtocolLimits = ProtocolLimits()) -> RelayConnectionStateMachine {
        var relay = RelayConnectionStateMachine(limits: limits)
        _ = relay.receive(.hello(Frame.Hello(maxFrameSize: 65_536, features: [], credential: [1], agentName: "t")), now: .now())
        _ = relay.acceptHello(account: "a")
        return relay
    }

    /// An agent after WELCOME with `streams` streams that got OFFSET START.
    static func readyAgent(connectionWindow: UInt32, streamWindow: UInt32, streams: Int) -> AgentConnectionStateMachine {
        var agent = AgentConnectionStateMachine()
        _ = agent.sendHello(Frame.Hello(maxFrameSize: 65_536, features: [], credential: [1], agentName: "t"))
        _ = agent.receive(
            .welcome(
                Frame.Welcome(
                    version: 1, maxFrameSize: 65_536, features: [], maxStreams: 64, connectionWindow: connectionWindow,
                    streamWindow: streamWindow, maxKeyLength: 1024, idleTimeoutMillis: 120_000, account: "a"
                )
            ),
            now: .now()
        )
        for i in 0..<streams {
            let id = StreamID(rawValue: UInt32(2 * i + 1))
            _ = agent.sendOpen(Frame.Open(streamID: id, key: "k\(i)", size: 1 << 20, sha1: nil, overwrite: false, fingerprint: [], resumeToken: []))
            _ = agent.receive(.offset(Frame.Offset(streamID: id, disposition: .start, offset: 0)), now: .now())
        }
        return agent
    }

    static func chunk(_ id: StreamID, at offset: UInt64, _ count: Int) -> Frame.Chunk {
        let bytes = [UInt8](repeating: 7, count: count)
        return Frame.Chunk(streamID: id, offset: offset, crc32: 0, data: ByteBuffer(bytes: bytes))
    }

    @Test("the last stream id (2^31-1) is used once: then no stream opens on the connection, and asking for the next id does not trap")
    func streamIDsRunOut() {
        var agent = Self.readyAgent(connectionWindow: 1 << 20, streamWindow: 1 << 20, streams: 0)
        func open(_ id: StreamID) -> Frame? {
            agent.sendOpen(Frame.Open(streamID: id, key: "k\(id)", size: 1, sha1: nil, overwrite: false, fingerprint: [], resumeToken: []))
        }
        #expect(open(StreamID(rawValue: StreamID.maxID.rawValue - 1)) != nil)
        #expect(agent.nextStreamID == StreamID.maxID && agent.canOpenStream && !agent.streamIDsExhausted)
        #expect(open(agent.nextStreamID) != nil)
        #expect(agent.streamIDsExhausted && !agent.canOpenStream)
        #expect(agent.nextStreamID == StreamID.maxID)
        #expect(open(agent.nextStreamID) == nil, "no id is left")
    }

    @Test("reads planned at once on two streams never promise the same connection credit; what a read leaves is given back")
    func reservationsShareConnectionCredit() async {
        // Issue 6 finding 1: two batches used to plan against the same connection credit, and the second trapped.
        var agent = Self.readyAgent(connectionWindow: 65_536, streamWindow: 65_536, streams: 2)
        let one = StreamID(rawValue: 1)
        let three = StreamID(rawValue: 3)
        #expect(agent.reserveCredit(on: one, upTo: 40_000) == 40_000)
        #expect(agent.reserveCredit(on: three, upTo: 40_000) == 25_536)
        #expect(agent.connectionCredit == 0)
        // Each stream sends within its own reservation, whatever the other did meanwhile.
        #expect(agent.sendChunk(Self.chunk(three, at: 0, 25_536)).frame != nil)
        #expect(agent.sendChunk(Self.chunk(one, at: 0, 30_000)).frame != nil)
        // Beyond reservation and credit: refused, nothing spent, no trap.
        guard case .refused = agent.sendChunk(Self.chunk(one, at: 30_000, 10_001)) else {
            Issue.record("a CHUNK beyond credit was not refused")
            return
        }
        #expect(agent.reservedCredit(on: one) == 10_000)
        agent.releaseReservation(on: one)
        #expect(agent.reservedCredit(on: one) == 0)
        #expect(agent.connectionCredit == 10_000)
        // A stream that closes with a reservation gives it back to the connection.
        #expect(agent.reserveCredit(on: one, upTo: 4_000) == 4_000)
        _ = agent.sendCancel(one, .cancelled, "stop")
        #expect(agent.connectionCredit == 10_000)
        // A CHUNK for a stream that is gone is dropped, not trapped on.
        #expect(agent.sendChunk(Self.chunk(one, at: 30_000, 10)) == .streamGone)
        #expect(agent.sendHash(Frame.Hash(streamID: one, size: 1, sha1: .empty)) == .streamGone)
    }

    @Test("randomized: any order of reserve, send, release, credit and close keeps credit within what the relay granted")
    func reservationsRandomized() async {
        var rng = SystemRandomNumberGenerator()
        let seed = UInt64.random(in: 0...UInt64.max, using: &rng)
        var random = SeededGenerator(seed: seed)
        var agent = Self.readyAgent(connectionWindow: 100_000, streamWindow: 30_000, streams: 4)
        var granted = 100_000
        var sent = 0
        var offsets: [StreamID: UInt64] = [:]
        let ids = (0..<4).map { StreamID(rawValue: UInt32(2 * $0 + 1)) }
        for _ in 0..<2_000 {
            let id = ids[Int(random.next() % 4)]
            switch random.next() % 4 {
            case 0:
                _ = agent.reserveCredit(on: id, upTo: Int(random.next() % 20_000))
            case 1:
                let count = 1 + Int(random.next() % 8_000)
                if case .send = agent.sendChunk(Self.chunk(id, at: offsets[id, default: 0], count)) {
                    offsets[id, default: 0] += UInt64(count)
                    sent += count
                }
            case 2:
                agent.releaseReservation(on: id)
            default:
                let increment = UInt32(random.next() % 10_000)
                if agent.receive(.credit(Frame.Credit(streamID: .connection, increment: increment)), now: .now()) == .creditGranted(.connection) {
                    granted += Int(increment)
                }
            }
            #expect(sent <= granted, "seed \(seed)")
            #expect(agent.connectionCredit >= 0, "seed \(seed)")
        }
    }

    @Test("ten PINGs a second are answered; the eleventh within the second is ENHANCE_YOUR_CALM")
    func pingFlood() async {
        var relay = Self.readyRelay()
        let start = NIODeadline.uptimeNanoseconds(1_000_000_000)
        for i in 0..<10 {
            let result1 = relay.receive(.ping(Frame.Ping(data: UInt64(i))), now: start + .milliseconds(Int64(i)))
            #expect(result1 == .send(.pong(Frame.Pong(data: UInt64(i)))))
        }
        guard case .closeConnection(let error) = relay.receive(.ping(Frame.Ping(data: 99)), now: start + .milliseconds(500)) else {
            Issue.record("flood not refused")
            return
        }
        #expect(error.code == .enhanceYourCalm)
    }

    @Test("an agent answers ten PINGs a second, and takes an eleventh within the second as a flood: ENHANCE_YOUR_CALM")
    func agentPingFlood() async {
        var agent = Self.readyAgent(connectionWindow: 65536, streamWindow: 65536, streams: 4)
        let start = NIODeadline.uptimeNanoseconds(1_000_000_000)
        for i in 0..<10 {
            #expect(
                agent.receive(.ping(Frame.Ping(data: UInt64(i))), now: start + .milliseconds(Int64(i))) == .send(.pong(Frame.Pong(data: UInt64(i)))))
        }
        // A second after the oldest, the window has slid: answered.
        #expect(agent.receive(.ping(Frame.Ping(data: 10)), now: start + .milliseconds(1000)) == .send(.pong(Frame.Pong(data: 10))))
        // The oldest of the last ten now came 999 ms before.
        guard case .closeConnection(let error) = agent.receive(.ping(Frame.Ping(data: 99)), now: start + .milliseconds(1000)) else {
            Issue.record("flood not refused")
            return
        }
        #expect(error.code == .enhanceYourCalm)
    }

    @Test("more refused OPENs in a second than the limit is a flood: ENHANCE_YOUR_CALM")
    func refusalFlood() async {
        var limits = ProtocolLimits()
        limits.maxRefusalsPerSecond = 5
        var relay = Self.readyRelay(limits: limits)
        let start = NIODeadline.uptimeNanoseconds(1_000_000_000)
        for i in 0..<5 {
            let id = StreamID(rawValue: UInt32(2 * i + 1))
            let open = Frame.Open(streamID: id, rawKey: Array("..".utf8), size: 1, sha1: nil, overwrite: false, fingerprint: [], resumeToken: [])
            guard case .resetStream(let error, _) = relay.receive(.open(open), now: start + .milliseconds(Int64(i))) else {
                Issue.record("bad key not refused")
                return
            }
            #expect(error.code == .invalidKey)
        }
        let open = Frame.Open(streamID: 11, rawKey: Array("..".utf8), size: 1, sha1: nil, overwrite: false, fingerprint: [], resumeToken: [])
        guard case .closeConnection(let error) = relay.receive(.open(open), now: start + .milliseconds(900)) else {
            Issue.record("flood of refusals not stopped")
            return
        }
        #expect(error.code == .enhanceYourCalm)
    }

    @Test("PINGs spread over time are never a flood")
    func pingsOverTime() async {
        var relay = Self.readyRelay()
        for i in 0..<100 {
            let now = NIODeadline.uptimeNanoseconds(UInt64(i) * 200_000_000)
            let result2 = relay.receive(.ping(Frame.Ping(data: 1)), now: now)
            #expect(result2 == .send(.pong(Frame.Pong(data: 1))))
        }
    }

    @Test("credit goes back only when storage consumed half the window, never on arrival")
    func creditBatching() async {
        var limits = ProtocolLimits()
        limits.streamWindow = 1000
        limits.connectionWindow = 4000
        var relay = Self.readyRelay(limits: limits)
        _ = relay.receive(.open(Frame.Open(streamID: 1, key: "k")), now: .now())
        _ = relay.sendOffset(Frame.Offset(streamID: 1, disposition: .start, offset: 0))
        let chunk = Frame.Chunk(streamID: 1, offset: 0, crc32: 0, data: ByteBuffer(repeating: 0, count: 400))
        let result3 = relay.receive(.chunk(chunk), now: .now())
        #expect(result3 == .write(chunk))
        let result4 = relay.storageConsumed(1, bytes: 400)
        #expect(result4 == [])
        var second = chunk
        second.offset = 400
        let result5 = relay.receive(.chunk(second), now: .now())
        #expect(result5 == .write(second))
        let result6 = relay.storageConsumed(1, bytes: 400)
        #expect(result6 == [.credit(Frame.Credit(streamID: 1, increment: 800))])
        #expect(relay.bufferedBytes == 0)
    }

    @Test("window arithmetic refuses to pass 2^31-1")
    func windowOverflow() async {
        var window = OutboundWindow(initial: ProtocolLimits.maxWindow - 10)
        let result7 = window.grant(10)
        #expect(result7)
        let result8 = window.grant(1)
        #expect(!result8)
        #expect(window.available == ProtocolLimits.maxWindow)
        var inbound = InboundWindow(target: 100)
        let result9 = inbound.receive(101)
        #expect(!result9)
        let result10 = inbound.receive(100)
        #expect(result10)
        let result11 = inbound.receive(1)
        #expect(!result11)
    }

    @Test("a resized window keeps back credit until it fits, grants beyond the bytes consumed when it grows, and never goes below 64 KiB")
    func resizedWindow() async {
        var window = InboundWindow(target: 100)
        let r1 = window.receive(100)
        #expect(r1)
        window.resize(to: 40)
        // 70 still outstanding (held), above 40: nothing back.
        let r2 = window.consume(30)
        #expect(r2 == nil)
        let r3 = window.consume(40)
        #expect(r3 == nil)
        // Nothing held and no credit: the whole of the new size comes back, not the 100 consumed.
        let r4 = window.consume(30)
        #expect(r4 == 40)
        #expect(window.available == 40 && window.outstanding == 40)
        // Grown while 10 are held: the credit makes the window whole at the new size, more than the 10 consumed.
        let r5 = window.receive(20)
        #expect(r5)
        window.resize(to: 300)
        let r6 = window.consume(10)
        #expect(r6 == 270)
        #expect(window.available == 290 && window.buffered == 10 && window.outstanding == 300)

        // The connection's window: no lower than 64 KiB (or WELCOME's window when smaller), and not before WELCOME.
        var relay = Self.readyRelay()
        relay.resizeConnectionWindow(to: 1)
        #expect(relay.connectionWindowSize == ProtocolLimits.smallestResizedWindow)
        relay.resizeConnectionWindow(to: 1 << 20)
        #expect(relay.connectionWindowSize == 1 << 20)
        var small = RelayConnectionStateMachine()
        _ = small.receive(.hello(Frame.Hello(maxFrameSize: 65_536, features: [], credential: [1], agentName: "t")), now: .now())
        small.resizeConnectionWindow(to: 1 << 20)
        #expect(small.connectionWindowSize == ProtocolLimits().connectionWindow, "no resize before WELCOME")
        _ = small.acceptHello(account: "a", connectionWindow: 1000)
        small.resizeConnectionWindow(to: 1)
        #expect(small.connectionWindowSize == 1000)
    }

    @Test("a stream reset by the relay returns its buffered bytes to the connection window at once")
    func resetReturnsBufferedCredit() async {
        var relay = Self.readyRelay()
        _ = relay.receive(.open(Frame.Open(streamID: 1, key: "k")), now: .now())
        _ = relay.sendOffset(Frame.Offset(streamID: 1, disposition: .start, offset: 0))
        let chunk = Frame.Chunk(streamID: 1, offset: 0, crc32: 0, data: ByteBuffer(repeating: 0, count: 300))
        _ = relay.receive(.chunk(chunk), now: .now())
        let frames = relay.resetStream(1, .storageError, "disk full", now: .now())
        #expect(
            frames == [
                .error(Frame.Error(streamID: 1, code: .storageError, message: "disk full")),
                .credit(Frame.Credit(streamID: .connection, increment: 300)),
            ])
        #expect(relay.bufferedBytes == 0)
        // Storage finishing the old write later changes nothing.
        let result12 = relay.storageConsumed(1, bytes: 300)
        #expect(result12 == [])
    }

    @Test(
        "object keys: the rules of SPEC §12.2",
        arguments: [
            ("a/b.jpg", true), ("dir/sub/file", true), ("é/ü.txt", true), ("..", false), ("a/../b", false),
            ("./a", false), ("/abs", false), ("a//b", false), ("a/", false), ("", false), ("a\u{0}b", false),
            ("a\u{7F}", false), ("a\\b", false), ("a\nb", false),
        ])
    func keyRules(key: String, valid: Bool) async {
        #expect(((try? ObjectKey(validating: key)) != nil) == valid)
    }

    @Test("key length limits")
    func keyLimits() async {
        #expect((try? ObjectKey(validating: String(repeating: "a", count: 255))) != nil)
        #expect((try? ObjectKey(validating: String(repeating: "a", count: 256))) == nil)
        let long = Array(repeating: String(repeating: "a", count: 200), count: 6).joined(separator: "/")
        #expect((try? ObjectKey(validating: long)) == nil)
        #expect((try? ObjectKey(validating: [0xC3, 0x28])) == nil)
    }
}
