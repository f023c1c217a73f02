import NIOCore
import UploadChecksums
import UploadPayload
@testable import UploadProtocol

/// The relay's half of the in-memory pump: the state machine plus the least relay logic that
/// exercises it (token check, sessions, CRC, SHA-1, commit), all in memory.
struct MemoryRelay {
    struct Upload {
        var key: String
        var bytes: [UInt8]
        var sha1: SHA1
    }

    struct Session {
        var token: [UInt8]
        var fingerprint: [UInt8]
        var bytes: [UInt8]
        var sha1: SHA1
    }

    var machine: RelayConnectionStateMachine
    var decoder = FrameDecoder()
    var tokens: [String: String] = ["good-token": "cam-7"]
    var uploads: [StreamID: Upload] = [:]
    var sessions: [String: Session] = [:]
    var store: [String: [UInt8]] = [:]
    /// When false, chunks wait in `unconsumed` until `consume()`: a slow disk.
    var consumeAtOnce = true
    var unconsumed: [(StreamID, Int)] = []
    var received: [Frame] = []
    var sent: [Frame] = []
    var events: [RelayAction] = []
    var closed = false
    var nextToken: UInt8 = 1

    init(limits: ProtocolLimits) {
        self.machine = RelayConnectionStateMachine(limits: limits)
    }

    mutating func receive(_ bytes: inout ByteBuffer) -> [Frame] {
        var out: [Frame] = []
        while !self.closed {
            let action: RelayAction
            do {
                self.decoder.maxFrameSize = self.machine.inboundFrameLimit
                guard let frame = try self.decoder.decodeFrame(from: &bytes) else { break }
                self.received.append(frame)
                action = self.machine.receive(frame)
            } catch let error as ProtocolError {
                action = self.machine.decodingFailed(error)
            } catch {
                fatalError("unexpected \(error)")
            }
            self.events.append(action)
            out += self.run(action)
        }
        self.sent += out
        return out
    }

    private mutating func run(_ action: RelayAction) -> [Frame] {
        switch action {
        case .none, .peerGoingAway:
            return []
        case .authenticate(let hello):
            guard let account = self.tokens[String(decoding: hello.credential, as: UTF8.self)] else {
                self.closed = true
                return [self.machine.failConnection(.unauthenticated, "unknown token")]
            }
            return self.machine.acceptHello(account: account).map { [$0] } ?? []
        case .openUpload(let open, let key):
            return self.open(open, key.value)
        case .write(let chunk):
            return self.write(chunk)
        case .finish(let hash):
            guard var upload = self.uploads[hash.streamID] else { return [] }
            let actual = SHA1Digest(bytes: upload.sha1.finalize())!
            guard actual == hash.sha1 else {
                self.uploads[hash.streamID] = nil
                self.sessions[upload.key] = nil
                return self.machine.resetStream(hash.streamID, .hashMismatch, "SHA-1 is \(actual), HASH says \(hash.sha1)")
            }
            self.store[upload.key] = upload.bytes
            self.sessions[upload.key] = nil
            upload.bytes = []
            self.uploads[hash.streamID] = nil
            let result = self.machine.sendResult(
                Frame.Result(streamID: hash.streamID, status: .stored, size: hash.size, sha1: actual, key: upload.key)
            )
            return (result.map { [$0] } ?? []) + (self.machine.flushConnectionCredit().map { [$0] } ?? [])
        case .abortUpload(let id, _, _, let discard, let credit):
            if let upload = self.uploads.removeValue(forKey: id), discard {
                self.sessions[upload.key] = nil
            }
            return credit.map { [.credit($0)] } ?? []
        case .send(let frame):
            return [frame]
        case .resetStream(let error, let credit):
            self.uploads[error.streamID] = nil
            return [.error(error)] + (credit.map { [.credit($0)] } ?? [])
        case .closeConnection(let error):
            self.closed = true
            return [.error(error)]
        case .peerClosed:
            self.closed = true
            return []
        }
    }

    private mutating func open(_ open: Frame.Open, _ key: String) -> [Frame] {
        let id = open.streamID
        if let sha1 = open.sha1, let size = open.size, let stored = self.store[key], UInt64(stored.count) == size,
            SHA1Digest(bytes: SHA1.hash(stored)) == sha1
        {
            let offset = self.machine.sendOffset(Frame.Offset(streamID: id, disposition: .stored, offset: size))
            return (offset.map { [$0] } ?? []) + (self.machine.flushConnectionCredit().map { [$0] } ?? [])
        }
        if let session = self.sessions[key],
            (!open.resumeToken.isEmpty && open.resumeToken == session.token)
                || (!open.fingerprint.isEmpty && open.fingerprint == session.fingerprint), !session.bytes.isEmpty
        {
            self.uploads[id] = Upload(key: key, bytes: session.bytes, sha1: session.sha1)
            let offset = Frame.Offset(
                streamID: id, disposition: .resume, offset: UInt64(session.bytes.count), resumeToken: session.token
            )
            return self.machine.sendOffset(offset).map { [$0] } ?? []
        }
        let token = [self.nextToken]
        self.nextToken += 1
        self.sessions[key] = Session(token: token, fingerprint: open.fingerprint, bytes: [], sha1: SHA1())
        self.uploads[id] = Upload(key: key, bytes: [], sha1: SHA1())
        return self.machine.sendOffset(Frame.Offset(streamID: id, disposition: .start, offset: 0, resumeToken: token))
            .map { [$0] } ?? []
    }

    private mutating func write(_ chunk: Frame.Chunk) -> [Frame] {
        let id = chunk.streamID
        let raw: [UInt8]
        switch ChunkPayload.open(chunk) {
        case .success(let bytes):
            raw = Array(bytes.readableBytesView)
        case .failure(let error):
            return self.machine.resetStream(id, error.code, error.message)
        }
        guard var upload = self.uploads[id] else { return [] }
        upload.bytes += raw
        upload.sha1.update(raw)
        self.uploads[id] = upload
        // Every write is durable at once here: the session keeps the acknowledged prefix and its SHA-1 state.
        self.sessions[upload.key]?.bytes = upload.bytes
        self.sessions[upload.key]?.sha1 = upload.sha1
        self.unconsumed.append((id, raw.count))
        return self.consumeAtOnce ? self.consume() : []
    }

    /// Storage takes every waiting chunk: credits and ACKs go out.
    mutating func consume() -> [Frame] {
        var out: [Frame] = []
        for (id, count) in self.unconsumed {
            out += self.machine.storageConsumed(id, bytes: count)
            if let upload = self.uploads[id], let ack = self.machine.sendAck(id, offset: UInt64(upload.bytes.count)) {
                out.append(ack)
            }
        }
        self.unconsumed.removeAll()
        self.sent += out
        return out
    }
}

/// The agent's half of the pump: uploads byte arrays with the state machine.
struct MemoryAgent {
    struct Job {
        var key: String
        var data: [UInt8]
        var announceSize = true
        var announceSHA1 = false
        var fingerprint: [UInt8] = []
        var resumeToken: [UInt8] = []
        /// Claims this SHA-1 in HASH instead of the real one.
        var lie: SHA1Digest? = nil
        var deflate = false
    }

    enum Outcome: Equatable {
        case stored(Frame.Result)
        case deduplicated
        case failed(WireErrorCode)
    }

    var machine: AgentConnectionStateMachine
    var decoder = FrameDecoder()
    var token = "good-token"
    var chunkSize = 1000
    var jobs: [StreamID: Job] = [:]
    var outcomes: [StreamID: Outcome] = [:]
    var resumeTokens: [StreamID: [UInt8]] = [:]
    var sentPayload: [StreamID: Int] = [:]
    var startedAt: [StreamID: UInt64] = [:]
    var acked: [StreamID: UInt64] = [:]
    var events: [AgentAction] = []
    var goingAway: Frame.GoAway? = nil
    var closed = false

    init(limits: ProtocolLimits = ProtocolLimits()) {
        self.machine = AgentConnectionStateMachine(limits: limits)
    }

    mutating func hello(features: Frame.Features = []) -> [Frame] {
        return [
            self.machine.sendHello(
                Frame.Hello(
                    maxFrameSize: UInt32(ProtocolLimits().maxFrameSize), features: features,
                    credential: Array(self.token.utf8), agentName: "test"
                )
            )
        ]
    }

    mutating func start(_ job: Job) -> (StreamID, [Frame]) {
        let id = self.machine.nextStreamID
        self.jobs[id] = job
        let sha1 = job.announceSHA1 ? SHA1Digest(bytes: SHA1.hash(job.data)) : nil
        let open = Frame.Open(
            streamID: id, key: job.key, size: job.announceSize ? UInt64(job.data.count) : nil, sha1: sha1,
            fingerprint: job.fingerprint, resumeToken: job.resumeToken
        )
        return (id, [self.machine.sendOpen(open)!])
    }

    mutating func receive(_ bytes: inout ByteBuffer) -> [Frame] {
        var out: [Frame] = []
        while !self.closed {
            let action: AgentAction
            do {
                self.decoder.maxFrameSize = self.machine.inboundFrameLimit
                guard let frame = try self.decoder.decodeFrame(from: &bytes) else { break }
                action = self.machine.receive(frame)
            } catch let error as ProtocolError {
                action = self.machine.decodingFailed(error)
            } catch {
                fatalError("unexpected \(error)")
            }
            self.events.append(action)
            switch action {
            case .none, .connected, .creditGranted:
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
    mutating func sendWhatCreditAllows() -> [Frame] {
        var out: [Frame] = []
        for id in self.machine.openStreamIDs {
            guard let job = self.jobs[id] else { continue }
            while let next = self.machine.nextOffset(on: id) {
                let offset = Int(next)
                if offset == job.data.count {
                    let real = SHA1Digest(bytes: SHA1.hash(job.data))!
                    out.append(self.machine.sendHash(Frame.Hash(streamID: id, size: next, sha1: job.lie ?? real)).frame!)
                    break
                }
                let credit = self.machine.sendableBytes(on: id)
                guard credit > 0 else { break }
                let n = min(credit, self.chunkSize, job.data.count - offset)
                let raw = Array(job.data[offset..<offset + n])
                let chunk = ChunkPayload.seal(ByteBuffer(bytes: raw), streamID: id, offset: next, deflate: job.deflate)
                self.sentPayload[id, default: 0] += n
                out.append(self.machine.sendChunk(chunk).frame!)
            }
        }
        return out
    }
}

/// Agent and relay joined by the real codec, with an optional hand on the frames in between.
struct Pump {
    var agent: MemoryAgent
    var relay: MemoryRelay
    var toRelay = ByteBuffer()
    var toAgent = ByteBuffer()
    /// Sees every frame the agent sends; returns what the relay gets instead (nil drops it).
    var tamper: (Frame) -> Frame? = { $0 }

    init(limits: ProtocolLimits = ProtocolLimits(), agentLimits: ProtocolLimits = ProtocolLimits()) {
        self.agent = MemoryAgent(limits: agentLimits)
        self.relay = MemoryRelay(limits: limits)
    }

    mutating func agentSends(_ frames: [Frame]) {
        for frame in frames {
            guard let frame = self.tamper(frame) else { continue }
            var bytes = frame.encoded()
            self.toRelay.writeBuffer(&bytes)
        }
    }

    mutating func relaySends(_ frames: [Frame]) {
        for frame in frames {
            var bytes = frame.encoded()
            self.toAgent.writeBuffer(&bytes)
        }
    }

    /// Moves bytes both ways until neither side has anything more to say.
    mutating func run() {
        var rounds = 0
        while self.toRelay.readableBytes > 0 || self.toAgent.readableBytes > 0 {
            rounds += 1
            precondition(rounds < 100_000, "pump does not settle")
            self.relaySends(self.relay.receive(&self.toRelay))
            self.agentSends(self.agent.receive(&self.toAgent))
        }
    }

    mutating func connect(features: Frame.Features = []) {
        self.agentSends(self.agent.hello(features: features))
        self.run()
    }

    @discardableResult
    mutating func upload(_ job: MemoryAgent.Job) -> StreamID {
        let (id, frames) = self.agent.start(job)
        self.agentSends(frames)
        return id
    }
}

extension AgentSendDecision {
    /// The frame to write, in tests that expect the agent to send.
    var frame: Frame? {
        if case .send(let frame) = self { return frame }
        return nil
    }
}
