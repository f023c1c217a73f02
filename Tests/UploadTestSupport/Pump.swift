import NIOCore
import UploadChecksums
import UploadPayload
import UploadProtocol
import UploadRelay

/// The agent's half of the pump: uploads byte arrays with the state machine.
public struct MemoryAgent {
    public struct Job {
        public var key: String
        public var data: [UInt8]
        public var announceSize = true
        public var announceSHA1 = false
        public var fingerprint: [UInt8] = []
        public var resumeToken: [UInt8] = []
        /// Claims this SHA-1 in HASH instead of the real one.
        public var lie: SHA1Digest? = nil
        public var deflate = false
        /// OPEN with STRIPED: the stream carries stripe 0 (SPEC §6.7).
        public var striped = false
        /// OPEN with PART: the stream carries this stripe of the upload named by ``resumeToken``.
        public var part: UInt32? = nil
        /// Sends no HASH at the end of the data until cleared (a striped upload waits for its stripes).
        public var holdHash = false

        /// The bytes this job's stream carries, as offsets into ``data``.
        public var range: Range<Int> {
            let stripes = Frame.Stripes(size: UInt64(self.data.count))
            if let part = self.part {
                let start = Int(stripes.start(of: Int(part)))
                return start..<start + Int(stripes.length(of: Int(part)))
            }
            return 0..<(self.striped ? Int(stripes.length(of: 0)) : self.data.count)
        }

        public init(
            key: String, data: [UInt8], announceSize: Bool = true, announceSHA1: Bool = false, fingerprint: [UInt8] = [],
            resumeToken: [UInt8] = [], lie: SHA1Digest? = nil, deflate: Bool = false, striped: Bool = false, part: UInt32? = nil,
            holdHash: Bool = false
        ) {
            self.striped = striped
            self.part = part
            self.holdHash = holdHash
            self.key = key
            self.data = data
            self.announceSize = announceSize
            self.announceSHA1 = announceSHA1
            self.fingerprint = fingerprint
            self.resumeToken = resumeToken
            self.lie = lie
            self.deflate = deflate
        }
    }

    public enum Outcome: Equatable {
        case stored(Frame.Result)
        case deduplicated
        case failed(WireErrorCode)
    }

    public var machine: AgentConnectionStateMachine
    public var decoder = FrameDecoder()
    public var token = "good-token"
    public var chunkSize = 1000
    public var jobs: [StreamID: Job] = [:]
    public var outcomes: [StreamID: Outcome] = [:]
    public var resumeTokens: [StreamID: [UInt8]] = [:]
    public var sentPayload: [StreamID: Int] = [:]
    public var startedAt: [StreamID: UInt64] = [:]
    public var acked: [StreamID: UInt64] = [:]
    public var events: [AgentAction] = []
    public var goingAway: Frame.GoAway? = nil
    public var closed = false

    public init(limits: ProtocolLimits = ProtocolLimits()) {
        self.machine = AgentConnectionStateMachine(limits: limits)
    }

    public mutating func hello(features: Frame.Features = []) -> [Frame] {
        return [
            self.machine.sendHello(
                Frame.Hello(
                    maxFrameSize: UInt32(ProtocolLimits().maxFrameSize), features: features,
                    credential: Array(self.token.utf8), agentName: "test"
                )
            )
        ]
    }

    public mutating func start(_ job: Job) -> (StreamID, [Frame]) {
        let id = self.machine.nextStreamID
        self.jobs[id] = job
        let sha1 = job.announceSHA1 ? SHA1Digest(bytes: SHA1.hash(job.data)) : nil
        let open = Frame.Open(
            streamID: id, key: job.key, size: job.announceSize ? UInt64(job.data.count) : nil, sha1: sha1,
            fingerprint: job.fingerprint, resumeToken: job.resumeToken, striped: job.striped, part: job.part
        )
        return (id, [self.machine.sendOpen(open)!])
    }

    public mutating func receive(_ bytes: inout ByteBuffer) -> [Frame] {
        var out: [Frame] = []
        while !self.closed {
            let action: AgentAction
            do {
                self.decoder.maxFrameSize = self.machine.inboundFrameLimit
                guard let frame = try self.decoder.decodeFrame(from: &bytes) else { break }
                action = self.machine.receive(frame, now: .now())
            } catch let error as ProtocolError {
                action = self.machine.decodingFailed(error)
            } catch {
                fatalError("unexpected \(error)")
            }
            self.events.append(action)
            switch action {
            case .none, .connected, .creditGranted, .room:
                break
            case .offset(let offset):
                self.resumeTokens[offset.streamID] = offset.resumeToken
                self.startedAt[offset.streamID] = offset.offset
                if offset.disposition == .stored {
                    self.outcomes[offset.streamID] = .deduplicated
                }
            case .acknowledged(let id, let offset):
                self.acked[id] = offset
            case .completed(let result):
                self.outcomes[result.streamID] = .stored(result)
            case .streamFailed(let id, let code, _):
                self.outcomes[id] = .failed(code)
            case .send(let frame):
                out.append(frame)
            case .resetStream(let error):
                self.outcomes[error.streamID] = .failed(error.code)
                out.append(.error(error))
            case .closeConnection(let error):
                self.closed = true
                out.append(.error(error))
            case .peerClosed:
                self.closed = true
            case .goingAway(let goAway):
                self.goingAway = goAway
            }
        }
        return out + self.sendWhatCreditAllows()
    }

    /// Reads "the source" only while credit is held: chunks for every sending stream, then HASH.
    public mutating func sendWhatCreditAllows() -> [Frame] {
        var out: [Frame] = []
        for id in self.machine.openStreamIDs {
            guard let job = self.jobs[id] else { continue }
            // A PART stream's offsets start at its stripe (SPEC §6.7).
            let range = job.range
            while let next = self.machine.nextOffset(on: id) {
                let offset = range.lowerBound + Int(next)
                if offset == range.upperBound {
                    guard !job.holdHash else { break }
                    let real = job.part == nil ? SHA1Digest(bytes: SHA1.hash(job.data))! : SHA1Digest(bytes: [UInt8](repeating: 0, count: 20))!
                    let size = job.part == nil ? UInt64(job.data.count) : next
                    out.append(self.machine.sendHash(Frame.Hash(streamID: id, size: size, sha1: job.lie ?? real)).frame!)
                    break
                }
                let credit = self.machine.sendableBytes(on: id)
                guard credit > 0 else { break }
                let n = min(credit, self.chunkSize, range.upperBound - offset)
                let raw = Array(job.data[offset..<offset + n])
                let chunk = ChunkPayload.seal(ByteBuffer(bytes: raw), streamID: id, offset: next, deflate: job.deflate)
                self.sentPayload[id, default: 0] += n
                out.append(self.machine.sendChunk(chunk).frame!)
            }
        }
        return out
    }
}

/// The agent's state machine (``MemoryAgent``) and the relay's real session (``RelayDriver``) joined by the real codec,
/// with an optional hand on the frames in between.
public struct Pump {
    public var agent: MemoryAgent
    public var relay: RelayDriver
    public var toRelay = ByteBuffer()
    public var toAgent = ByteBuffer()
    /// Every frame the relay got from the agent (after `tamper`).
    public var agentSent: [Frame] = []
    /// Sees every frame the agent sends; returns what the relay gets instead (nil drops it).
    public var tamper: (Frame) -> Frame? = { $0 }

    /// A pump on a relay of its own whose protocol limits are `limits`.
    public init(
        limits: ProtocolLimits = ProtocolLimits(), agentLimits: ProtocolLimits = ProtocolLimits(),
        configure: (inout RelayConfiguration) -> Void = { _ in }
    ) async throws {
        let backend = try await RelayBackend { configuration in
            configuration.limits = limits
            configure(&configuration)
        }
        await self.init(backend: backend, agentLimits: agentLimits)
    }

    /// A new connection to `backend` (the relay of an earlier pump, say).
    public init(backend: RelayBackend, agentLimits: ProtocolLimits = ProtocolLimits()) async {
        self.agent = MemoryAgent(limits: agentLimits)
        self.relay = RelayDriver(backend: backend)
        self.relaySends(await self.relay.start())
    }

    public mutating func agentSends(_ frames: [Frame]) {
        for frame in frames {
            guard let frame = self.tamper(frame) else { continue }
            self.agentSent.append(frame)
            var bytes = frame.encoded()
            self.toRelay.writeBuffer(&bytes)
        }
    }

    public mutating func relaySends(_ frames: [Frame]) {
        for frame in frames {
            var bytes = frame.encoded()
            self.toAgent.writeBuffer(&bytes)
        }
    }

    /// Moves bytes both ways until neither side has anything more to say.
    public mutating func run() async {
        var rounds = 0
        while self.toRelay.readableBytes > 0 || self.toAgent.readableBytes > 0 {
            rounds += 1
            precondition(rounds < 100_000, "pump does not settle")
            self.relaySends(await self.relay.receive(&self.toRelay))
            self.agentSends(self.agent.receive(&self.toAgent))
        }
    }

    /// Storage takes every waiting step (a stalled disk catches up), then the pump runs.
    public mutating func runStorage(limit: Int = .max) async {
        self.relaySends(await self.relay.runStorage(limit: limit))
        await self.run()
    }

    /// The relay's clock moves on (sync timers, the drain, timeouts), then the pump runs.
    public mutating func advance(by amount: TimeAmount) async {
        self.relaySends(await self.relay.advance(by: amount))
        await self.run()
    }

    public mutating func connect(features: Frame.Features = []) async {
        self.agentSends(self.agent.hello(features: features))
        await self.run()
    }

    @discardableResult
    public mutating func upload(_ job: MemoryAgent.Job) -> StreamID {
        let (id, frames) = self.agent.start(job)
        self.agentSends(frames)
        return id
    }
}

extension AgentSendDecision {
    /// The frame to write, in tests that expect the agent to send.
    public var frame: Frame? {
        if case .send(let frame) = self { return frame }
        return nil
    }
}
