import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOPosix
import Testing
import UploadProtocol
import UploadTestSupport

@testable import UploadAgent

/// ``AgentConnectionHandler`` on a `NIOAsyncTestingChannel`, its bytes carried to and from the relay's real session
/// (``RelayDriver``): it turns channel events into session inputs, runs source reads on the thread pool, and reports.
@Suite("Agent connection handler")
struct AgentConnectionHandlerTests {
    @Test(
        "a file goes up through the handler: HELLO at connect, reads on the pool, RESULT, the outcome reported, closed",
        .timeLimit(.minutes(1)))
    func upload() async throws {
        let directory = TemporaryDirectories.make()
        let file = makeFile(directory, "clip.bin", size: 3 << 20, seed: 9)
        var configuration = AgentConfiguration(relayHost: "relay", relayPort: 1, token: "good-token", caPath: nil)
        configuration.dedup = false
        let job = UploadJob(item: UploadItem(key: "clips/clip.bin", displayPath: file.path, source: FileSource(path: file.path)))
        let queue = JobQueue([job])
        let events = NIOLockedValueBox<[UploadEvent]>([])
        let channel = NIOAsyncTestingChannel()
        let done = channel.testingEventLoop.makePromise(of: ConnectionOutcome.self)
        try await channel.testingEventLoop.executeInContext { [configuration] in
            let handler = AgentConnectionHandler(
                configuration: configuration, queue: queue, pool: .singleton, bandwidth: nil, logger: Logger(label: "handler-test"), done: done,
                onEvent: { event in events.withLockedValue { $0.append(event) } }
            )
            try channel.pipeline.syncOperations.addHandler(handler)
        }
        try await channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1))

        var relay = await RelayDriver(backend: try RelayBackend())
        var toAgent = await relay.start()
        while channel.isActive {
            if !toAgent.isEmpty {
                var bytes = ByteBuffer()
                for frame in toAgent { bytes.writeImmutableBuffer(FrameEncoder.encodeToBuffer(frame)) }
                toAgent = []
                try await channel.writeInbound(bytes)
                continue
            }
            var written = try await channel.waitForOutboundWrite(as: ByteBuffer.self)
            toAgent = await relay.receive(&written)
        }
        let outcome = try await done.futureResult.get()
        #expect(outcome.reason == nil && !outcome.fatal && outcome.madeProgress)
        #expect(job.result?.status == .stored)
        await #expect(relay.backend.object("clips/clip.bin") == Array(file.data))
        #expect(events.withLockedValue { $0 }.contains { if case .connected = $0 { true } else { false } })
    }
}
