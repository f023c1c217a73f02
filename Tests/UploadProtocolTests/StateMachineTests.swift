import NIOCore
import Testing
@testable import UploadProtocol

@Suite("State machines, one at a time")
struct StateMachineTests {
    static func readyRelay(limits: ProtocolLimits = ProtocolLimits()) -> RelayConnectionStateMachine {
        var relay = RelayConnectionStateMachine(limits: limits)
        _ = relay.receive(.hello(Frame.Hello(maxFrameSize: 65_536, features: [], credential: [1], agentName: "t")))
        _ = relay.acceptHello(account: "a")
        return relay
    }

    @Test("ten PINGs a second are answered; the eleventh within the second is ENHANCE_YOUR_CALM")
    func pingFlood() {
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

    @Test("PINGs spread over time are never a flood")
    func pingsOverTime() {
        var relay = Self.readyRelay()
        for i in 0..<100 {
            let now = NIODeadline.uptimeNanoseconds(UInt64(i) * 200_000_000)
            let result2 = relay.receive(.ping(Frame.Ping(data: 1)), now: now)
            #expect(result2 == .send(.pong(Frame.Pong(data: 1))))
        }
    }

    @Test("credit goes back only when storage consumed half the window, never on arrival")
    func creditBatching() {
        var limits = ProtocolLimits()
        limits.streamWindow = 1000
        limits.connectionWindow = 4000
        var relay = Self.readyRelay(limits: limits)
        _ = relay.receive(.open(Frame.Open(streamID: 1, key: "k")))
        _ = relay.sendOffset(Frame.Offset(streamID: 1, disposition: .start, offset: 0))
        let chunk = Frame.Chunk(streamID: 1, offset: 0, crc32: 0, data: ByteBuffer(repeating: 0, count: 400))
        let result3 = relay.receive(.chunk(chunk))
        #expect(result3 == .write(chunk))
        let result4 = relay.storageConsumed(1, bytes: 400)
        #expect(result4 == [])
        var second = chunk
        second.offset = 400
        let result5 = relay.receive(.chunk(second))
        #expect(result5 == .write(second))
        let result6 = relay.storageConsumed(1, bytes: 400)
        #expect(result6 == [.credit(Frame.Credit(streamID: 1, increment: 800))])
        #expect(relay.bufferedBytes == 0)
    }

    @Test("window arithmetic refuses to pass 2^31-1")
    func windowOverflow() {
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

    @Test("a stream reset by the relay returns its buffered bytes to the connection window at once")
    func resetReturnsBufferedCredit() {
        var relay = Self.readyRelay()
        _ = relay.receive(.open(Frame.Open(streamID: 1, key: "k")))
        _ = relay.sendOffset(Frame.Offset(streamID: 1, disposition: .start, offset: 0))
        let chunk = Frame.Chunk(streamID: 1, offset: 0, crc32: 0, data: ByteBuffer(repeating: 0, count: 300))
        _ = relay.receive(.chunk(chunk))
        let frames = relay.resetStream(1, .storageError, "disk full")
        #expect(frames == [
            .error(Frame.Error(streamID: 1, code: .storageError, message: "disk full")),
            .credit(Frame.Credit(streamID: .connection, increment: 300)),
        ])
        #expect(relay.bufferedBytes == 0)
        // Storage finishing the old write later changes nothing.
        let result12 = relay.storageConsumed(1, bytes: 300)
        #expect(result12 == [])
    }

    @Test("object keys: the rules of SPEC §12.2", arguments: [
        ("a/b.jpg", true), ("dir/sub/file", true), ("é/ü.txt", true), ("..", false), ("a/../b", false),
        ("./a", false), ("/abs", false), ("a//b", false), ("a/", false), ("", false), ("a\u{0}b", false),
        ("a\u{7F}", false), ("a\\b", false), ("a\nb", false),
    ])
    func keyRules(key: String, valid: Bool) {
        #expect(((try? ObjectKey(validating: key)) != nil) == valid)
    }

    @Test("key length limits")
    func keyLimits() {
        #expect((try? ObjectKey(validating: String(repeating: "a", count: 255))) != nil)
        #expect((try? ObjectKey(validating: String(repeating: "a", count: 256))) == nil)
        let long = Array(repeating: String(repeating: "a", count: 200), count: 6).joined(separator: "/")
        #expect((try? ObjectKey(validating: long)) == nil)
        #expect((try? ObjectKey(validating: [0xC3, 0x28])) == nil)
    }
}
