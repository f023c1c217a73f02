import NIOCore
import Testing
import UploadChecksums
@testable import UploadProtocol
import UploadTestSupport

/// The agent and relay state machines pumped against each other through the real codec, no sockets.
@Suite("Agent against relay, in memory")
struct ScenarioTests {
    static func data(_ count: Int, seed: UInt64 = 1) -> [UInt8] {
        var rng = SeededGenerator(seed: seed)
        return (0..<count).map { _ in UInt8.random(in: 0...255, using: &rng) }
    }

    static var smallWindows: ProtocolLimits {
        var limits = ProtocolLimits()
        limits.connectionWindow = 8192
        limits.streamWindow = 4096
        return limits
    }

    @Test("a new upload: chunks within credit, ACKs, HASH, RESULT, byte-identical in the store")
    func newUpload() throws {
        var pump = Pump(limits: Self.smallWindows)
        pump.connect()
        let bytes = Self.data(50_000)
        let id = pump.upload(MemoryAgent.Job(key: "photos/IMG_0001.jpg", data: bytes))
        pump.run()
        let outcome = try #require(pump.agent.outcomes[id])
        guard case .stored(let result) = outcome else {
            Issue.record("expected stored, got \(outcome)")
            return
        }
        #expect(result.key == "photos/IMG_0001.jpg")
        #expect(result.sha1 == SHA1Digest(bytes: SHA1.hash(bytes)))
        #expect(pump.relay.store["photos/IMG_0001.jpg"] == bytes)
        #expect(pump.agent.sentPayload[id] == bytes.count)
        #expect(pump.agent.acked[id] == UInt64(bytes.count))
        #expect(pump.relay.machine.openStreamCount == 0)
        #expect(pump.agent.machine.openStreamCount == 0)
        #expect(pump.relay.machine.bufferedBytes == 0)
        // SPEC §5.4: once the stream closed, every byte is back in the connection window, the last half-window too.
        #expect(pump.agent.machine.connectionCredit == Self.smallWindows.connectionWindow)
    }

    @Test("empty, one-byte and unknown-length blobs")
    func edgeSizes() throws {
        var pump = Pump()
        pump.connect()
        let empty = pump.upload(MemoryAgent.Job(key: "empty", data: []))
        let one = pump.upload(MemoryAgent.Job(key: "one", data: [42]))
        let unknown = pump.upload(MemoryAgent.Job(key: "stdin", data: Self.data(3333), announceSize: false))
        pump.run()
        for id in [empty, one, unknown] {
            guard case .stored = pump.agent.outcomes[id] else {
                Issue.record("stream \(id): \(String(describing: pump.agent.outcomes[id]))")
                continue
            }
        }
        #expect(pump.relay.store["empty"] == [])
        #expect(pump.relay.store["one"] == [42])
        #expect(pump.relay.store["stdin"] == Self.data(3333))
    }

    @Test("many uploads share one connection as concurrent streams")
    func concurrentStreams() {
        var pump = Pump(limits: Self.smallWindows)
        pump.connect()
        var ids: [StreamID: [UInt8]] = [:]
        for i in 0..<20 {
            let bytes = Self.data(5000 + i * 97, seed: UInt64(i))
            ids[pump.upload(MemoryAgent.Job(key: "dir/\(i).bin", data: bytes))] = bytes
        }
        pump.run()
        for (id, bytes) in ids {
            guard case .stored(let result) = pump.agent.outcomes[id] else {
                Issue.record("stream \(id) not stored")
                continue
            }
            #expect(pump.relay.store[result.key] == bytes)
        }
    }

    @Test("resume: a second connection continues from the durable offset and sends only the rest")
    func resumeAtOffset() throws {
        let bytes = Self.data(40_000)
        var first = Pump(limits: Self.smallWindows)
        first.connect()
        var forwarded = 0
        // The link dies after 12,000 payload bytes: nothing more reaches the relay.
        first.tamper = { frame in
            if case .chunk(let chunk) = frame {
                forwarded += chunk.payloadLength
                return forwarded <= 12_000 ? frame : nil
            }
            if case .hash = frame { return nil }
            return frame
        }
        let id1 = first.upload(MemoryAgent.Job(key: "big.bin", data: bytes, fingerprint: [7, 7]))
        first.run()
        #expect(first.agent.outcomes[id1] == nil)
        let durable = try #require(first.agent.acked[id1])
        // Everything that arrived was acknowledged: the last whole chunk before the cut.
        #expect(durable <= 12_000 && durable > 11_000)
        #expect(durable == UInt64(first.relay.sessions["big.bin"]!.bytes.count))
        let token = try #require(first.agent.resumeTokens[id1])

        var second = Pump(limits: Self.smallWindows)
        second.relay.sessions = first.relay.sessions
        second.connect()
        let id2 = second.upload(MemoryAgent.Job(key: "big.bin", data: bytes, resumeToken: token))
        second.run()
        #expect(second.agent.startedAt[id2] == durable)
        #expect(second.agent.sentPayload[id2] == bytes.count - Int(durable))
        guard case .stored = second.agent.outcomes[id2] else {
            Issue.record("not stored: \(String(describing: second.agent.outcomes[id2]))")
            return
        }
        #expect(second.relay.store["big.bin"] == bytes)

        // Found by fingerprint alone, without the token, too.
        var third = Pump(limits: Self.smallWindows)
        third.relay.sessions = first.relay.sessions
        third.connect()
        let id3 = third.upload(MemoryAgent.Job(key: "big.bin", data: bytes, fingerprint: [7, 7]))
        third.run()
        #expect(third.agent.startedAt[id3] == durable)
        #expect(third.relay.store["big.bin"] == bytes)
    }

    @Test("dedup: OPEN with size and SHA-1 of stored content gets OFFSET STORED, no byte is sent")
    func dedupHit() {
        var pump = Pump()
        let bytes = Self.data(10_000)
        pump.relay.store["same.jpg"] = bytes
        pump.connect()
        let id = pump.upload(MemoryAgent.Job(key: "same.jpg", data: bytes, announceSHA1: true))
        pump.run()
        #expect(pump.agent.outcomes[id] == .deduplicated)
        #expect(pump.agent.sentPayload[id] == nil)
        #expect(!pump.relay.received.contains { if case .chunk = $0 { true } else { false } })
    }

    @Test("CRC mismatch: the corrupted chunk is refused, nothing is committed, the other stream completes")
    func crcMismatch() {
        var pump = Pump(limits: Self.smallWindows)
        pump.connect()
        pump.tamper = { frame in
            guard case .chunk(var chunk) = frame, chunk.streamID == 1, chunk.offset == 2000 else { return frame }
            var bytes = Array(chunk.data.readableBytesView)
            bytes[10] ^= 0x01
            chunk.data = ByteBuffer(bytes: bytes)
            return .chunk(chunk)
        }
        let bad = pump.upload(MemoryAgent.Job(key: "bad", data: Self.data(9000)))
        pump.upload(MemoryAgent.Job(key: "good", data: Self.data(9000, seed: 2)))
        pump.run()
        #expect(pump.agent.outcomes[bad] == .failed(.crcMismatch))
        #expect(pump.relay.store["bad"] == nil)
        #expect(pump.relay.store["good"] == Self.data(9000, seed: 2))
        // Chunks in flight on the reset stream were discarded and their connection credit returned.
        #expect(pump.relay.machine.bufferedBytes == 0)
        #expect(pump.agent.machine.connectionCredit == Self.smallWindows.connectionWindow)
    }

    @Test("SHA-1 mismatch: an agent that lies about the hash gets HASH_MISMATCH and nothing is committed")
    func sha1Mismatch() {
        var pump = Pump()
        pump.connect()
        let liar = pump.upload(MemoryAgent.Job(key: "liar", data: Self.data(3000), lie: SHA1Digest.empty))
        pump.run()
        #expect(pump.agent.outcomes[liar] == .failed(.hashMismatch))
        #expect(pump.relay.store["liar"] == nil)
        #expect(pump.relay.sessions["liar"] == nil)
    }

    @Test("cancel: the relay forgets the session; frames already in flight are discarded")
    func cancel() {
        var pump = Pump(limits: Self.smallWindows)
        pump.relay.consumeAtOnce = false
        pump.connect()
        let id = pump.upload(MemoryAgent.Job(key: "cancelled", data: Self.data(30_000)))
        pump.run()
        // The relay holds a full window of unconsumed chunks; the agent cancels meanwhile.
        #expect(pump.relay.machine.bufferedBytes == Self.smallWindows.streamWindow)
        let cancel = pump.agent.machine.sendCancel(id, .cancelled, "user stopped it")
        #expect(cancel != nil)
        pump.agentSends(cancel.map { [$0] } ?? [])
        pump.relaySends(pump.relay.consume())
        pump.run()
        #expect(pump.relay.events.contains(.abortUpload(id, .cancelled, "user stopped it", discardSession: true, connectionCredit: nil)))
        #expect(pump.agent.machine.connectionCredit == Self.smallWindows.connectionWindow)
        #expect(pump.relay.sessions["cancelled"] == nil)
        #expect(pump.relay.store["cancelled"] == nil)
        #expect(!pump.agent.closed && !pump.relay.closed)
    }

    @Test(
        "CANCEL or ERROR(N) of a stream whose bytes storage has not consumed gives them back to the connection at once (SPEC §5.4)",
        arguments: [true, false]
    )
    func agentCloseReturnsHeldCredit(cancel: Bool) {
        var pump = Pump(limits: Self.smallWindows)
        pump.relay.consumeAtOnce = false
        pump.connect()
        for round in 0..<4 {
            let id = pump.upload(MemoryAgent.Job(key: "k\(round)", data: Self.data(30_000)))
            pump.run()
            #expect(pump.relay.machine.bufferedBytes == Self.smallWindows.streamWindow)
            let close: Frame? =
                cancel
                ? pump.agent.machine.sendCancel(id, .cancelled, "stop")
                : pump.agent.machine.sendCancel(id, .cancelled, "stop").map { _ in .error(Frame.Error(streamID: id, code: .cancelled, message: "stop")) }
            pump.agentSends(close.map { [$0] } ?? [])
            pump.run()
            // Every byte the stream held is returned; storage consuming them later returns nothing twice.
            #expect(pump.agent.machine.connectionCredit == Self.smallWindows.connectionWindow)
            pump.relaySends(pump.relay.consume())
            pump.run()
            #expect(pump.agent.machine.connectionCredit == Self.smallWindows.connectionWindow)
            #expect(pump.relay.machine.bufferedBytes == 0)
        }
        #expect(!pump.agent.closed && !pump.relay.closed)
    }

    @Test("backpressure: with storage stalled the agent stops at its credit, and resumes when storage consumes")
    func creditExhaustedThenRefilled() {
        var pump = Pump(limits: Self.smallWindows)
        pump.relay.consumeAtOnce = false
        pump.connect()
        let bytes = Self.data(20_000)
        let id = pump.upload(MemoryAgent.Job(key: "slow", data: bytes))
        pump.run()
        #expect(pump.agent.sentPayload[id] == Self.smallWindows.streamWindow)
        #expect(pump.agent.machine.sendableBytes(on: id) == 0)
        var rounds = 0
        while pump.agent.outcomes[id] == nil {
            rounds += 1
            #expect(pump.relay.machine.bufferedBytes <= Self.smallWindows.streamWindow)
            pump.relaySends(pump.relay.consume())
            pump.run()
            if rounds > 100 { break }
        }
        #expect(rounds > 3)
        #expect(pump.relay.store["slow"] == bytes)
    }

    @Test("GOAWAY with uploads in flight: open streams finish, new ones are refused")
    func goAwayWithUploadsInFlight() {
        var pump = Pump(limits: Self.smallWindows)
        pump.relay.consumeAtOnce = false
        pump.connect()
        let inFlight = pump.upload(MemoryAgent.Job(key: "in-flight", data: Self.data(10_000)))
        pump.run()
        let goAway = pump.relay.machine.sendGoAway(.noError, "relay shutting down")
        #expect(goAway != nil)
        pump.relaySends(goAway.map { [$0] } ?? [])
        pump.run()
        #expect(pump.agent.goingAway?.lastStreamID == inFlight)
        #expect(!pump.agent.machine.canOpenStream)
        // An agent that opens anyway (it had not seen GOAWAY yet) is refused on that stream only.
        var late = pump.relay.machine
        let refused = late.receive(.open(Frame.Open(streamID: 3, key: "late")))
        #expect(refused == .resetStream(
            Frame.Error(streamID: 3, code: .refusedStream, message: "the relay is going away; open stream 3 on a new connection"),
            connectionCredit: nil
        ))
        while pump.agent.outcomes[inFlight] == nil && pump.relay.unconsumed.count > 0 {
            pump.relaySends(pump.relay.consume())
            pump.run()
        }
        guard case .stored = pump.agent.outcomes[inFlight] else {
            Issue.record("in-flight upload did not finish: \(String(describing: pump.agent.outcomes[inFlight]))")
            return
        }
    }

    @Test("a bad token closes the connection with UNAUTHENTICATED before any stream")
    func badToken() {
        var pump = Pump()
        pump.agent.token = "wrong"
        pump.connect()
        #expect(pump.agent.events.contains(.peerClosed(.unauthenticated, "unknown token")))
        #expect(pump.agent.closed)
    }

    @Test("deflate, when negotiated, carries compressible chunks and the store gets the raw bytes")
    func deflate() {
        var pump = Pump()
        pump.connect(features: .deflate)
        #expect(pump.relay.machine.negotiatedFeatures == .deflate)
        let text = Array(String(repeating: "all work and no play ", count: 2000).utf8)
        let id = pump.upload(MemoryAgent.Job(key: "text.txt", data: text, deflate: true))
        pump.run()
        guard case .stored = pump.agent.outcomes[id] else {
            Issue.record("not stored")
            return
        }
        #expect(pump.relay.store["text.txt"] == text)
        #expect(pump.relay.received.contains { if case .chunk(let c) = $0 { c.isDeflated } else { false } })
    }

    @Test("a hostile key is refused on its stream; the connection and other streams go on")
    func hostileKey() {
        var pump = Pump()
        pump.connect()
        let bad = pump.upload(MemoryAgent.Job(key: "../../etc/passwd", data: [1]))
        let good = pump.upload(MemoryAgent.Job(key: "ok", data: [2]))
        pump.run()
        #expect(pump.agent.outcomes[bad] == .failed(.invalidKey))
        guard case .stored = pump.agent.outcomes[good] else {
            Issue.record("good stream failed")
            return
        }
        #expect(pump.relay.store.keys.sorted() == ["ok"])
    }
}
