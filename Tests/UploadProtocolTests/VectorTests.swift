import Foundation
import NIOCore
import Testing
import UploadChecksums
@testable import UploadProtocol
import UploadPayload
import UploadTestSupport

/// Loads every vector of protocol/vectors/ (SPEC appendix A): the spec's own bytes, written
/// by an implementation that never saw this Swift code.
@Suite("Protocol vectors")
struct VectorTests {
    static let directory = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("protocol/vectors")

    static func names(_ kind: String) -> [String] {
        let folder = Self.directory.appendingPathComponent(kind)
        let names = (try? FileManager.default.contentsOfDirectory(atPath: folder.path)) ?? []
        return names.filter { $0.hasSuffix(".json") }.sorted()
    }

    static func load(_ kind: String, _ name: String) -> [String: Any] {
        let data = try! Data(contentsOf: Self.directory.appendingPathComponent(kind).appendingPathComponent(name))
        return try! JSONSerialization.jsonObject(with: data) as! [String: Any]
    }

    static func bytes(_ hex: Any?) -> ByteBuffer {
        ByteBuffer(bytes: [UInt8](hexString: hex as! String)!)
    }

    @Test("there are vectors for every frame type, and at least 15 invalid inputs")
    func coverage() async {
        let types = Set(Self.names("valid").compactMap { (Self.load("valid", $0)["frame"] as? [String: Any])?["type"] as? String })
        for type in [
            "HELLO", "WELCOME", "OPEN", "OFFSET", "CHUNK", "ACK", "CREDIT", "HASH", "RESULT", "ERROR", "CANCEL", "PING", "PONG", "GOAWAY", "PLAN",
            "ROOM",
        ] {
            #expect(types.contains(type), "no valid vector for \(type)")
        }
        #expect(Self.names("invalid").count >= 15)
    }

    @Test("valid vectors decode to their JSON and encode back to their bytes", arguments: Self.names("valid"))
    func validVector(name: String) async throws {
        let vector = Self.load("valid", name)
        var input = Self.bytes(vector["hex"])
        let original = input
        var decoder = FrameDecoder(maxFrameSize: ProtocolLimits.largestMaxFrameSize)
        let frame = try #require(try decoder.decodeFrame(from: &input))
        #expect(input.readableBytes == 0)
        let expected = FrameJSON.stringify(vector["frame"] as! [String: Any])
        let flags = original.getInteger(at: 5, as: UInt8.self)!
        #expect(FrameJSON.fields(frame, flags: flags) == expected)
        #expect(frame.encoded() == original, "re-encoding \(name)")
    }

    @Test("invalid vectors produce exactly their error, and other streams stay open", arguments: Self.names("invalid"))
    func invalidVector(name: String) async throws {
        let vector = Self.load("invalid", name)
        let expected = vector["error"] as! [String: Any]
        let code = try #require(WireErrorCode(name: expected["code"] as! String))
        let scope = expected["scope"] as! String
        let stream = StreamID(UInt32(expected["stream"] as! Int))
        let setup = (vector["setup"] as! [[String: String]])
        var replay = VectorReplay(receiver: vector["receiver"] as! String, setup: setup)
        try replay.runSetup()
        let before = replay.openStreams
        let outcome = replay.receive(Self.bytes(vector["input"]))
        switch outcome {
        case .connectionError(let got):
            #expect(scope == "connection", "\(name): got a connection error \(got)")
            #expect(got.code == code, "\(name): \(got)")
        case .streamError(let got):
            #expect(scope == "stream", "\(name): got a stream error \(got)")
            #expect(got.code == code, "\(name): \(got)")
            #expect(got.streamID == stream, "\(name): \(got)")
            let others = before.filter { $0 != stream }
            #expect(others.allSatisfy(replay.openStreams.contains), "\(name): another stream was closed")
        case .noError(let what):
            Issue.record("\(name): no error, \(what)")
        }
    }
}

/// Replays a vector's setup on the receiver's state machine, then feeds it the input.
struct VectorReplay {
    enum Outcome {
        case connectionError(Frame.Error)
        case streamError(Frame.Error)
        case noError(String)
    }

    let isRelay: Bool
    let setup: [[String: String]]
    var relay: RelayConnectionStateMachine
    var agent = AgentConnectionStateMachine()
    var decoder = FrameDecoder()
    /// The relay's running SHA-1 per stream: the vector relay verifies like a real one (SPEC §8).
    var hashes: [StreamID: SHA1] = [:]

    init(receiver: String, setup: [[String: String]]) {
        self.isRelay = receiver == "relay"
        self.setup = setup
        // The relay's limits are the ones its WELCOME announces in the setup.
        var limits = ProtocolLimits()
        var features = Frame.Features.known
        for step in setup {
            if let hex = step["send"], case .welcome(let w)? = Self.decode(hex) {
                limits.maxFrameSize = Int(w.maxFrameSize)
                limits.maxConcurrentStreams = Int(w.maxStreams)
                limits.connectionWindow = Int(w.connectionWindow)
                limits.streamWindow = Int(w.streamWindow)
                limits.maxKeyLength = Int(w.maxKeyLength)
                limits.idleTimeout = .milliseconds(w.idleTimeoutMillis)
                features = w.features
            }
        }
        self.relay = RelayConnectionStateMachine(limits: limits, supportedFeatures: features)
    }

    static func decode(_ hex: String) -> Frame? {
        var decoder = FrameDecoder(maxFrameSize: ProtocolLimits.largestMaxFrameSize)
        var bytes = ByteBuffer(bytes: [UInt8](hexString: hex)!)
        return try? decoder.decodeFrame(from: &bytes)
    }

    var openStreams: [StreamID] { self.isRelay ? self.relay.openStreamIDs : self.agent.openStreamIDs }

    struct SetupFailed: Error, CustomStringConvertible {
        var description: String
    }

    mutating func runSetup() throws {
        for step in self.setup {
            if let hex = step["send"] {
                guard let frame = Self.decode(hex) else { throw SetupFailed(description: "setup frame \(hex) does not decode") }
                try self.send(frame)
            } else if let hex = step["receive"] {
                if case .noError = self.receive(ByteBuffer(bytes: [UInt8](hexString: hex)!)) {
                    continue
                }
                throw SetupFailed(description: "setup frame \(hex) failed")
            }
        }
    }

    private mutating func send(_ frame: Frame) throws {
        var produced: Frame?
        if self.isRelay {
            switch frame {
            case .welcome(let w):
                produced = self.relay.acceptHello(account: w.account)
                self.decoder.maxFrameSize = Int(w.maxFrameSize)
            case .offset(let o):
                produced = self.relay.sendOffset(o)
                if o.disposition == .resume {
                    // A resumed stream's SHA-1 state comes from the catalog; vectors resume only where it does not matter.
                    self.hashes[o.streamID] = SHA1()
                }
            case .ack(let a):
                produced = self.relay.sendAck(a.streamID, offset: a.offset)
            case .result(let r):
                produced = self.relay.sendResult(r)
            case .error(let e):
                produced = self.relay.resetStream(e.streamID, e.code, e.message, now: .now()).first
            case .goAway(let g):
                produced = self.relay.sendGoAway(g.code, g.message)
            case .room(let r):
                produced = self.relay.sendRoom(r)
            default:
                throw SetupFailed(description: "a relay cannot send \(frame.type.name) in a setup")
            }
        } else {
            switch frame {
            case .hello(let h):
                produced = self.agent.sendHello(h)
                self.decoder.maxFrameSize = Int(h.maxFrameSize)
            case .open(let o):
                produced = self.agent.sendOpen(o)
            case .chunk(let c):
                produced = self.agent.sendChunk(c).frame
            case .hash(let h):
                produced = self.agent.sendHash(h).frame
            case .cancel(let c):
                produced = self.agent.sendCancel(c.streamID, c.code, c.message)
            case .plan(let p):
                produced = self.agent.sendPlan(p)
            default:
                throw SetupFailed(description: "an agent cannot send \(frame.type.name) in a setup")
            }
        }
        guard produced == frame else {
            throw SetupFailed(description: "the state machine sent \(String(describing: produced)) where the vector sends \(frame)")
        }
    }

    mutating func receive(_ input: ByteBuffer) -> Outcome {
        var bytes = input
        var frames: [Frame] = []
        do {
            while let frame = try self.decoder.decodeFrame(from: &bytes) {
                frames.append(frame)
            }
        } catch let error as ProtocolError {
            return self.outcome(ofDecodingError: error)
        } catch {
            return .noError("unexpected \(error)")
        }
        guard bytes.readableBytes == 0 else {
            return .noError("\(bytes.readableBytes) bytes left undecoded")
        }
        var last = "no frame decoded"
        for frame in frames {
            if self.isRelay {
                switch self.relay.receive(frame, now: .now()) {
                case .closeConnection(let e): return .connectionError(e)
                case .resetStream(let e, _): return .streamError(e)
                case .write(let chunk):
                    switch ChunkPayload.open(chunk) {
                    case .success(let raw):
                        raw.withUnsafeReadableBytes { self.hashes[chunk.streamID, default: SHA1()].update($0) }
                        last = "write"
                    case .failure(let error):
                        return self.resetByRelay(error)
                    }
                case .finish(let hash):
                    let actual = SHA1Digest(bytes: (self.hashes[hash.streamID] ?? SHA1()).finalize())!
                    guard actual == hash.sha1 else {
                        return self.resetByRelay(.stream(hash.streamID, .hashMismatch, "SHA-1 is \(actual)"))
                    }
                    last = "finish"
                case let other: last = "\(other)"
                }
            } else {
                switch self.agent.receive(frame, now: .now()) {
                case .closeConnection(let e): return .connectionError(e)
                case .resetStream(let e): return .streamError(e)
                case let other: last = "\(other)"
                }
            }
        }
        return .noError(last)
    }

    private mutating func resetByRelay(_ error: ProtocolError) -> Outcome {
        guard case .stream(let id) = error.scope else { return .noError("not a stream error") }
        guard case .error(let e)? = self.relay.resetStream(id, error.code, error.message, now: .now()).first else {
            return .noError("stream \(id) could not be reset")
        }
        return .streamError(e)
    }

    private mutating func outcome(ofDecodingError error: ProtocolError) -> Outcome {
        if self.isRelay, case .closeConnection(let e) = self.relay.decodingFailed(error) {
            return .connectionError(e)
        }
        if !self.isRelay, case .closeConnection(let e) = self.agent.decodingFailed(error) {
            return .connectionError(e)
        }
        return .noError("decoding error \(error) did not close the connection")
    }
}
