import Foundation
import NIOCore
import Testing
import UploadChecksums
import UploadProtocol
import UploadTestSupport

@testable import UploadAgent
import UploadRelay

/// The agent's real session against the relay's real session, in memory: frames as bytes both ways, cut at random
/// places; the agent's source work (open and hash, read, hash a prefix) and the relay's storage steps run in an order
/// a seeded generator picks, as threads and a slow disk would. No socket, no thread pool, no clock.
struct SessionPump {
    var agent: AgentSession
    var relay: RelayDriver
    let queue: JobQueue
    var rng: SeededGenerator
    var toRelay = ByteBuffer()
    var toAgent = ByteBuffer()
    /// The agent's source work, done when asked; its completion waits here for its turn to reach the session.
    var work: [(inout AgentSession) -> [AgentSession.Action]] = []
    /// The agent's backoff timers that are due once nothing else moves.
    var timers: [AgentSession.Timer] = []
    var outcome: ConnectionOutcome? = nil
    var agentClosed = false
    var events: [UploadEvent] = []
    /// Connections cut by the schedule so far, and the most it may cut.
    var cuts = 0
    let maxCuts: Int
    /// Connections made, the first included.
    var connections = 1

    init(items: [UploadItem], backend: RelayBackend, seed: UInt64, maxCuts: Int = 0, configure: (inout AgentConfiguration) -> Void = { _ in }) async {
        var configuration = AgentConfiguration(relayHost: "relay", relayPort: 1, token: "good-token", caPath: nil)
        configure(&configuration)
        self.queue = JobQueue(items.map { UploadJob(item: $0) })
        self.agent = AgentSession(configuration: configuration, queue: self.queue)
        self.relay = RelayDriver(backend: backend)
        self.rng = SeededGenerator(seed: seed)
        self.maxCuts = maxCuts
        await self.send(toAgent: self.relay.start())
        self.run(self.agent.connected(now: .now))
    }

    /// A new connection for what the queue still holds, as the uploader makes after a break: the old session's source
    /// work finished first (against it, as the pool would), its timers dropped (it requeued what they held).
    mutating func reconnect() async {
        while !self.work.isEmpty {
            let completion = self.work.removeFirst()
            self.run(completion(&self.agent))
        }
        self.timers.removeAll()
        self.toRelay.clear()
        self.toAgent.clear()
        self.agent = AgentSession(configuration: self.agent.configuration, queue: self.queue)
        self.relay = RelayDriver(backend: self.relay.backend)
        self.outcome = nil
        self.agentClosed = false
        self.connections += 1
        await self.send(toAgent: self.relay.start())
        self.run(self.agent.connected(now: .now))
    }

    mutating func send(toAgent frames: [Frame]) {
        for frame in frames {
            var bytes = frame.encoded()
            self.toAgent.writeBuffer(&bytes)
        }
    }

    /// Runs the agent's actions as ``AgentConnectionHandler`` does, its source work queued for the schedule.
    mutating func run(_ actions: [AgentSession.Action]) {
        for action in actions {
            switch action {
            case .write(let frame):
                guard !self.agentClosed else { continue }
                var bytes = frame.encoded()
                self.toRelay.writeBuffer(&bytes)
            case .close:
                self.agentClosed = true
            case .schedule(let timer, _):
                // The welcome and progress deadlines are not due in a pump whose relay always answers.
                switch timer {
                case .backoff, .refusals: self.timers.append(timer)
                case .welcome, .progress: break
                }
            case .prepare(let job, let dedup, let probe):
                let (journal, limit) = (self.queue.journal, self.agent.configuration.maxReopensInARow)
                let result = Result {
                    try SourceReader.prepare(
                        job.item.source, info: job.info, knownSHA1: job.knownSHA1, dedup: dedup, probe: probe, reopenLimit: limit, journal: journal)
                }
                self.work.append { $0.prepared(job, result) }
            case .read(let request):
                let result = Result { try SourceReader.read(request, bandwidth: nil) }
                self.work.append { $0.readFinished(request.streamID, result) }
            case .hashPrefix(let id, let source, let from, let offset, let reopening):
                let result = Result { try SourceReader.hashPrefix(of: source, from: from, upTo: offset, reopening: reopening) }
                self.work.append { $0.prefixHashed(id, result) }
            case .event(let event):
                self.events.append(event)
            case .log:
                break
            case .finished(let outcome), .planned(let outcome):
                self.outcome = outcome
            }
        }
    }

    /// One step of the schedule; false once nothing can move.
    mutating func step() async -> Bool {
        var choices: [Int] = []
        if self.toRelay.readableBytes > 0 && !self.relay.closed { choices.append(0) }
        if self.toAgent.readableBytes > 0 && !self.agentClosed { choices.append(1) }
        if !self.work.isEmpty { choices.append(2) }
        if self.relay.pendingStorageCount > 0 { choices.append(3) }
        if self.cuts < self.maxCuts && !choices.isEmpty && Int.random(in: 0..<80, using: &self.rng) == 0 { choices = [4] }
        guard let choice = choices.randomElement(using: &self.rng) else {
            if self.outcome != nil && !self.queue.isDone && self.connections < 20 {
                await self.reconnect()
                return true
            }
            if !self.timers.isEmpty, !self.agentClosed {
                let timer = self.timers.removeFirst()
                self.run(self.agent.timerFired(timer, now: .now))
                return true
            }
            return false
        }
        switch choice {
        case 0:
            // Some of what the agent wrote, cut anywhere.
            let count = Int.random(in: 1...self.toRelay.readableBytes, using: &self.rng)
            var piece = self.toRelay.readSlice(length: count)!
            await self.send(toAgent: self.relay.receive(&piece))
            if self.relay.closed { await self.closeBoth() }
        case 1:
            let count = Int.random(in: 1...self.toAgent.readableBytes, using: &self.rng)
            let piece = self.toAgent.readSlice(length: count)!
            self.agent.received(piece)
            while let actions = self.agent.nextFrame(now: .now) { self.run(actions) }
            if self.agentClosed { await self.closeBoth() }
        case 2:
            let index = Int.random(in: 0..<self.work.count, using: &self.rng)
            let completion = self.work.remove(at: index)
            self.run(completion(&self.agent))
        case 3:
            await self.send(toAgent: self.relay.runStorage(limit: Int.random(in: 1...3, using: &self.rng)))
        default:
            // The link breaks: what is in flight is lost; the agent connects again for what is left.
            self.cuts += 1
            await self.closeBoth()
        }
        return true
    }

    /// Either side closed: what is in flight is lost, both sessions hear the connection is gone.
    mutating func closeBoth() async {
        guard self.outcome == nil else { return }
        self.toRelay.clear()
        self.toAgent.clear()
        await self.relay.connectionClosed()
        self.run(self.agent.connectionClosed())
    }
}

@Suite("The real agent and relay sessions, pumped against each other")
struct SessionPumpTests {
    @Test(
        "seeded schedules: photos and a video, dedup on, frames cut anywhere, source work and storage in any order, odd rounds with links broken and resumed: every file stored exactly",
        arguments: Array(0..<40) + [166, 190]
    )
    // Rounds 166 and 190: a large file's twin parked while its stream awaited a probe's CONFIRM was never released (the
    // stream left without ending, and came back under its SHA-1), so the connection never closed.
    func seeded(_ round: Int) async throws {
        let seed = UInt64(truncatingIfNeeded: Int(ProcessInfo.processInfo.environment["PUMP_SEED"] ?? "").map { $0 + round } ?? (71_000 + round))
        print("session pump seed \(seed) (PUMP_SEED=\(seed) replays it)")
        var rng = SeededGenerator(seed: seed)
        let directory = TemporaryDirectories.make(prefix: "upload-pump-")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var files: [(key: String, data: Data)] = []
        var items: [UploadItem] = []
        let count = Int.random(in: 1...12, using: &rng)
        for index in 0..<count {
            let size = index == 0 ? Int.random(in: 1...(6 << 20), using: &rng) : Int.random(in: 0...300_000, using: &rng)
            var file = makeFile(directory, "f\(index).bin", size: size, seed: seed &+ UInt64(index))
            if index > 1 && index % 4 == 0 {
                // Every fourth file repeats the first small one's bytes: the relay dedups it.
                file.data = files[1].data
                #expect(FileManager.default.createFile(atPath: file.path, contents: file.data))
            }
            files.append(("pump/f\(index).bin", file.data))
            items.append(UploadItem(key: "pump/f\(index).bin", displayPath: file.path, source: FileSource(path: file.path)))
        }
        let backend = try await RelayBackend { $0.syncBytes = Int.random(in: 4096...(1 << 20), using: &rng) }
        var pump = await SessionPump(items: items, backend: backend, seed: seed, maxCuts: round % 2 == 0 ? 0 : 3) { configuration in
            configuration.chunkSize = [16 << 10, 64 << 10, 256 << 10][Int.random(in: 0..<3, using: &rng)]
            configuration.dedup = true
        }
        var steps = 0
        while await pump.step() {
            steps += 1
            try #require(steps < 2_000_000, "seed \(seed): the sessions never settle")
        }
        #expect(
            pump.queue.isDone,
            "seed \(seed): the queue is not done after \(steps) steps; outcome \(String(describing: pump.outcome)); agent closed \(pump.agentClosed), relay closed \(pump.relay.closed); senders \(pump.agent.senders.count), preparing \(pump.agent.preparing), delayed \(pump.agent.delayed.count), twins \(pump.agent.twins.count), deferred \(pump.agent.deferred.count), timers \(pump.timers); events \(pump.events.suffix(6))"
        )
        let results = pump.queue.results
        #expect(results.count == files.count, "seed \(seed)")
        for result in results {
            #expect(result.status == .stored || result.status == .deduplicated, "seed \(seed): \(result.key): \(result.error ?? "")")
        }
        if count >= 5 && pump.cuts == 0 {
            // Without a break the twin waits for the first upload and is answered by the relay's dedup; after a break
            // either may have sent bytes first.
            #expect(results.contains { $0.status == .deduplicated && $0.sentBytes == 0 }, "seed \(seed): no file was deduplicated")
        }
        for (key, data) in files {
            let stored = await backend.object(key)
            #expect(
                stored.map { $0 == Array(data) } ?? false,
                "seed \(seed): \(key) is not stored exactly (\(stored.map { "\($0.count) bytes" } ?? "absent"), \(data.count) bytes sent)")
        }
        print("session pump seed \(seed): \(steps) steps, \(pump.cuts) links broken, \(pump.connections) connections")
        if !pump.agentClosed { await pump.closeBoth() }
        #expect(!backend.holdsResources, "seed \(seed): the relay holds resources after the connection closed")
    }
}
