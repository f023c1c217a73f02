import NIOConcurrencyHelpers
import NIOCore
import Testing
import UploadProtocol
import UploadTestSupport

@testable import UploadAgent
import UploadChecksums

/// An agent session driven by hand: frames from a scripted relay in, actions out. No socket, no thread, no file read.
struct AgentHarness {
    var session: AgentSession
    let queue: JobQueue
    var now = ContinuousClock.now
    let jobs: [UploadJob]

    init(files: Int, size: UInt64 = 4 << 20, seekable: Bool = true, configure: (inout AgentConfiguration) -> Void = { _ in }) {
        var configuration = AgentConfiguration(relayHost: "relay", relayPort: 1, token: "t", caPath: nil)
        configuration.dedup = false
        configure(&configuration)
        self.jobs = (0..<files).map { i in
            let source: any BlobSource = seekable ? FileSource(path: "/nonexistent/\(i)") : StreamSource(descriptor: -1)
            let job = UploadJob(item: UploadItem(key: "k\(i)", displayPath: "f\(i)", source: source))
            job.info = SourceInfo(size: size, fingerprint: [UInt8(i)])
            return job
        }
        self.queue = JobQueue(self.jobs)
        self.session = AgentSession(configuration: configuration, queue: self.queue)
    }

    @discardableResult
    mutating func receive(_ frames: Frame...) -> [AgentSession.Action] {
        var bytes = ByteBuffer()
        for frame in frames { bytes.writeImmutableBuffer(FrameEncoder.encodeToBuffer(frame)) }
        self.session.received(bytes)
        var actions: [AgentSession.Action] = []
        while let more = self.session.nextFrame(now: self.now) { actions += more }
        // As the connection handler does after each input.
        self.session.noteOwed(now: self.now)
        return actions
    }

    /// HELLO, then WELCOME with these windows; every job prepared and opened. Returns the OPENs' stream ids.
    mutating func connect(connectionWindow: UInt32, streamWindow: UInt32, features: Frame.Features = []) -> [StreamID] {
        _ = self.session.connected(now: self.now)
        let welcome = self.receive(
            .welcome(
                Frame.Welcome(
                    version: 1, maxFrameSize: 1 << 20, features: features, maxStreams: 64, connectionWindow: connectionWindow,
                    streamWindow: streamWindow, maxKeyLength: 1024, idleTimeoutMillis: 120_000, account: "a"
                )
            )
        )
        var ids: [StreamID] = []
        for case .prepare(let job, _, _) in welcome {
            let opened = self.session.prepared(job, .success(SourceReader.Prepared(info: job.info!, sha1: nil)))
            for frame in Self.frames(opened) { if case .open(let open) = frame { ids.append(open.streamID) } }
        }
        self.session.noteOwed(now: self.now)
        return ids
    }

    static func frames(_ actions: [AgentSession.Action]) -> [Frame] {
        actions.compactMap { if case .write(let frame) = $0 { return frame } else { return nil } }
    }

    static func reads(_ actions: [AgentSession.Action]) -> [SourceReader.Request] {
        actions.compactMap { if case .read(let request) = $0 { return request } else { return nil } }
    }

    /// The batch a read of `request` would produce, `bytes` long (at most its budget).
    static func batch(_ request: SourceReader.Request, bytes: Int, ended: Bool = false) -> SourceReader.Batch {
        let chunk = Frame.Chunk(
            streamID: request.streamID, offset: request.offset, crc32: 0, data: ByteBuffer(bytes: [UInt8](repeating: 1, count: bytes))
        )
        return SourceReader.Batch(
            chunks: bytes > 0 ? [chunk] : [], sha1: request.sha1, ended: ended, nextOffset: request.offset + UInt64(bytes),
            deflateTried: request.deflate
        )
    }
}

@Suite("Agent session: connection decisions without sockets")
struct AgentSessionTests {
    @Test("reads of several streams reserve credit before they start: together never more than the connection window")
    func readsReserveCredit() async {
        var h = AgentHarness(files: 3)
        let ids = h.connect(connectionWindow: 3 << 20, streamWindow: 2 << 20)
        #expect(ids.count == 3)
        var requests: [SourceReader.Request] = []
        for id in ids {
            requests += AgentHarness.reads(h.receive(.offset(Frame.Offset(streamID: id, disposition: .start, offset: 0))))
        }
        #expect(requests.map(\.budget).reduce(0, +) <= 3 << 20, "budgets \(requests.map(\.budget))")
        #expect(requests.count == 2, "the third stream waits for credit")
        // The first read used half its budget: the rest goes back, and a next read reserves again.
        let first = requests[0]
        let after = h.session.readFinished(first.streamID, .success(AgentHarness.batch(first, bytes: first.budget / 2)))
        #expect(AgentHarness.frames(after).contains { $0.type == .chunk })
        let next = AgentHarness.reads(after)
        #expect(next.allSatisfy { $0.offset == UInt64(first.budget / 2) || $0.streamID != first.streamID })
        #expect(h.session.machine.connectionCredit >= 0)
    }

    @Test("with deflate, a chunk that did not shrink sends the next 15 reads raw, then deflate is tried again; one that shrank keeps it")
    func deflateBacksOffOnIncompressibleData() async throws {
        var h = AgentHarness(files: 1, size: 64 << 20) { $0.deflate = true }
        let id = h.connect(connectionWindow: 1 << 30, streamWindow: 1 << 30, features: .deflate)[0]
        var request = try #require(AgentHarness.reads(h.receive(.offset(Frame.Offset(streamID: id, disposition: .start, offset: 0)))).first)
        var tried: [Bool] = []
        func next(_ request: SourceReader.Request, _ batch: SourceReader.Batch) throws -> SourceReader.Request {
            try #require(AgentHarness.reads(h.session.readFinished(id, .success(batch))).first)
        }
        for _ in 0..<18 {
            tried.append(request.deflate)
            // Incompressible: the chunk stayed raw.
            request = try next(request, AgentHarness.batch(request, bytes: 4096))
        }
        #expect(tried == [true] + Array(repeating: false, count: 15) + [true, false])
        // Data that compresses: the chunk went out at a tenth of its size, and the next read tries deflate again.
        while !request.deflate { request = try next(request, AgentHarness.batch(request, bytes: 4096)) }
        var shrunk = AgentHarness.batch(request, bytes: 4096)
        shrunk.chunks[0].rawLength = 40_960
        #expect(try next(request, shrunk).deflate)
    }

    @Test("--concurrency: a job being prepared takes a whole place; once small (<= 256 KiB) it takes an eighth; large ones a place each")
    func smallUploadsShareAPlace() async {
        // 2 places: 16 shares.
        var small = AgentHarness(files: 40, size: 100_000) { $0.concurrency = 2 }
        _ = small.session.connected(now: .now)
        var prepares = small.receive(
            .welcome(
                Frame.Welcome(
                    maxFrameSize: 1 << 20, features: [], maxStreams: 64, connectionWindow: 1 << 30, streamWindow: 1 << 20,
                    maxKeyLength: 1024, idleTimeoutMillis: 0, account: "a"
                )
            )
        )
        var opened = 0
        var most = 0
        // Prepare in rounds until no new job starts. A job being prepared holds a whole place (8 shares) until its size
        // is known, so the 16 shares settle at 9 small uploads: 8 + 1 + the 8 a next preparation would need > 16.
        while true {
            let jobs = prepares.compactMap { if case .prepare(let job, _, _) = $0 { return job } else { return nil } }
            if jobs.isEmpty { break }
            prepares = []
            for job in jobs {
                let actions = small.session.prepared(job, .success(SourceReader.Prepared(info: job.info!, sha1: nil)))
                opened += AgentHarness.frames(actions).filter { $0.type == .open }.count
                prepares += actions
            }
            prepares += small.session.openMore()
            most = max(most, small.session.senders.count)
        }
        #expect(opened == 9 && most == 9, "\(opened) opened, \(most) at once")

        var large = AgentHarness(files: 10, size: 4 << 20) { $0.concurrency = 2 }
        let ids = large.connect(connectionWindow: 1 << 30, streamWindow: 1 << 20)
        #expect(ids.count == 2)
        #expect(large.session.openMore().isEmpty, "a third large upload started")
    }

    @Test("a job whose HASH went out gives its place back: the next job is prepared while the relay commits")
    func hashSentFreesThePlace() async {
        var h = AgentHarness(files: 2, size: 3 << 20) { $0.concurrency = 1 }
        let ids = h.connect(connectionWindow: 32 << 20, streamWindow: 8 << 20)
        #expect(ids.count == 1)
        var actions = h.receive(.offset(Frame.Offset(streamID: ids[0], disposition: .start, offset: 0)))
        var rounds = 0
        while let read = AgentHarness.reads(actions).first, rounds < 100 {
            rounds += 1
            #expect(!actions.contains { if case .prepare = $0 { return true } else { return false } }, "prepared before HASH")
            let ended = read.offset >= 3 << 20
            actions = h.session.readFinished(read.streamID, .success(AgentHarness.batch(read, bytes: ended ? 0 : read.budget, ended: ended)))
        }
        #expect(AgentHarness.frames(actions).contains { $0.type == .hash })
        let prepared = actions.compactMap { if case .prepare(let job, _, _) = $0 { return job } else { return nil } }
        #expect(prepared.count == 1 && prepared.first === h.jobs[1], "\(actions)")
    }

    @Test("dedup probe: a large file is opened with its first MiB's SHA-1; CONFIRM prepares it again, hashed whole, and opens it with its SHA-1")
    func probeThenConfirm() async throws {
        var h = AgentHarness(files: 1, size: 8 << 20) { $0.dedup = true }
        _ = h.session.connected(now: .now)
        let welcome = h.receive(
            .welcome(
                Frame.Welcome(
                    maxFrameSize: 1 << 20, features: .dedupProbe, maxStreams: 64, connectionWindow: 1 << 30, streamWindow: 1 << 20,
                    maxKeyLength: 1024, idleTimeoutMillis: 0, account: "a"
                )
            )
        )
        guard case .prepare(let job, true, true)? = welcome.first(where: { if case .prepare = $0 { return true } else { return false } }) else {
            Issue.record("no prepare with the probe: \(welcome)")
            return
        }
        let probe = SHA1Digest(bytes: [UInt8](repeating: 5, count: 20))
        let opened = AgentHarness.frames(h.session.prepared(job, .success(SourceReader.Prepared(info: job.info!, sha1: nil, probe: probe))))
        guard case .open(let first)? = opened.first else {
            Issue.record("no OPEN: \(opened)")
            return
        }
        #expect(first.probe == probe && first.sha1 == nil)
        let confirmed = h.receive(.offset(Frame.Offset(streamID: first.streamID, disposition: .confirm, offset: 0)))
        guard case .prepare(let again, true, false)? = confirmed.first(where: { if case .prepare = $0 { return true } else { return false } }) else {
            Issue.record("CONFIRM did not prepare the job again without the probe: \(confirmed)")
            return
        }
        #expect(again === job)
        let whole = SHA1Digest(bytes: [UInt8](repeating: 6, count: 20))
        let reopened = AgentHarness.frames(h.session.prepared(again, .success(SourceReader.Prepared(info: job.info!, sha1: whole))))
        guard case .open(let second)? = reopened.first else {
            Issue.record("no second OPEN: \(reopened)")
            return
        }
        #expect(second.sha1 == whole && second.probe == nil && second.streamID > first.streamID)
    }

    @Test(
        "a HASH answered by an error (the commit's answer lost): the next OPEN of the unchanged source states that SHA-1, and STORED is reported stored; a changed source opens without it",
        arguments: [false, true]
    )
    func undecidedCommitReopensWithItsSHA1(changed: Bool) async throws {
        var h = AgentHarness(files: 1, size: 1 << 20)
        let id = h.connect(connectionWindow: 8 << 20, streamWindow: 8 << 20)[0]
        var actions = h.receive(.offset(Frame.Offset(streamID: id, disposition: .start, offset: 0)))
        var hash: Frame.Hash? = nil
        for _ in 0..<100 {
            for case .hash(let sent) in AgentHarness.frames(actions) { hash = sent }
            guard let read = AgentHarness.reads(actions).first else { break }
            let ended = read.offset >= 1 << 20
            actions = h.session.readFinished(read.streamID, .success(AgentHarness.batch(read, bytes: ended ? 0 : read.budget, ended: ended)))
        }
        let digest = try #require(hash?.sha1, "no HASH sent")
        // The relay's store failed to answer the commit: the stream ends with an error that allows a retry.
        let failed = h.receive(.error(Frame.Error(streamID: id, code: .internalError, message: "the relay failed to commit; retry later")))
        guard case .prepare(let job, _, _)? = failed.first(where: { if case .prepare = $0 { return true } else { return false } }) else {
            Issue.record("the job was not prepared again: \(failed)")
            return
        }
        let info = SourceInfo(size: 1 << 20, fingerprint: changed ? [9, 9] : job.info!.fingerprint)
        let reopened = AgentHarness.frames(h.session.prepared(job, .success(SourceReader.Prepared(info: info, sha1: nil))))
        guard case .open(let open)? = reopened.first else {
            Issue.record("no second OPEN: \(reopened)")
            return
        }
        if changed {
            #expect(open.sha1 == nil, "a changed source was opened with the SHA-1 of what it held before")
            return
        }
        #expect(open.sha1 == digest)
        h.receive(.offset(Frame.Offset(streamID: open.streamID, disposition: .stored, offset: 1 << 20)))
        let result = try #require(h.queue.results.first)
        #expect(result.status == .stored && result.sha1 == digest.hex, "\(result)")
    }

    @Test("a full socket pauses reads though credit remains; once it drains they go on, every stream")
    func fullSocketPausesReads() async {
        var h = AgentHarness(files: 2)
        let ids = h.connect(connectionWindow: 32 << 20, streamWindow: 8 << 20)
        let first = AgentHarness.reads(h.receive(.offset(Frame.Offset(streamID: ids[0], disposition: .start, offset: 0))))
        #expect(first.count == 1)
        // The first batch's CHUNKs filled the socket's buffer.
        #expect(h.session.writabilityChanged(false).isEmpty)
        let after = h.session.readFinished(ids[0], .success(AgentHarness.batch(first[0], bytes: first[0].budget)))
        #expect(AgentHarness.frames(after).contains { $0.type == .chunk })
        #expect(AgentHarness.reads(after).isEmpty, "a read started while the socket was full")
        #expect(AgentHarness.reads(h.receive(.offset(Frame.Offset(streamID: ids[1], disposition: .start, offset: 0)))).isEmpty)
        // Drained: both streams read again, the first from where its batch ended.
        let resumed = AgentHarness.reads(h.session.writabilityChanged(true))
        #expect(Set(resumed.map(\.streamID)) == Set(ids))
        #expect(resumed.first { $0.streamID == ids[0] }?.offset == UInt64(first[0].budget))
    }

    @Test("the offset of a stream lives in the state machine: a read starts where the relay's OFFSET said")
    func resumeOffset() async {
        var h = AgentHarness(files: 1)
        let id = h.connect(connectionWindow: 8 << 20, streamWindow: 8 << 20)[0]
        // A resume at an offset this run never sent, from a seekable source: the prefix is hashed locally first.
        let resumed = h.receive(.offset(Frame.Offset(streamID: id, disposition: .resume, offset: 1000)))
        #expect(resumed.contains { if case .hashPrefix(id, _, from: _, upTo: 1000, reopening: _) = $0 { return true } else { return false } })
        let reads = AgentHarness.reads(h.session.prefixHashed(id, .success(.init())))
        #expect(reads.map(\.offset) == [1000])
    }

    @Test("a stream source cannot resume at bytes it no longer holds: CANCEL, and the item fails saying why")
    func streamSourceCannotResume() async {
        var h = AgentHarness(files: 1, seekable: false)
        let id = h.connect(connectionWindow: 8 << 20, streamWindow: 8 << 20)[0]
        let actions = h.receive(.offset(Frame.Offset(streamID: id, disposition: .resume, offset: 1000)))
        #expect(AgentHarness.frames(actions).contains { $0.type == .cancel })
        #expect(h.queue.results.first?.error?.contains("cannot resume at 1000") == true)
    }

    @Test(
        "a stream source that cannot follow the relay's retry fails with the relay's error (soak seed 4702 round 26: a full disk reported as stdin's)"
    )
    func streamSourceAfterRefusal() async throws {
        var h = AgentHarness(files: 1, seekable: false)
        let id = h.connect(connectionWindow: 8 << 20, streamWindow: 8 << 20)[0]
        let failed = h.receive(.error(Frame.Error(streamID: id, code: .internalError, message: "the staging file failed")))
        let job = try #require(
            failed.lazy.compactMap { action -> UploadJob? in if case .prepare(let job, _, _) = action { return job } else { return nil } }.first,
            "retried at once: \(failed)")
        let opened = h.session.prepared(job, .success(SourceReader.Prepared(info: job.info!, sha1: nil)))
        let again = try #require(
            AgentHarness.frames(opened).lazy.compactMap { if case .open(let o) = $0 { return o.streamID } else { return nil } }.first)
        h.receive(.offset(Frame.Offset(streamID: again, disposition: .resume, offset: 1000)))
        let result = try #require(h.queue.results.first)
        #expect(result.errorCode == WireErrorCode.internalError.name, "\(result)")
        #expect(result.error?.contains("the staging file failed") == true && result.error?.contains("cannot resume at 1000") == true, "\(result)")
    }

    static func closes(_ actions: [AgentSession.Action]) -> Bool {
        actions.contains { if case .close = $0 { return true } else { return false } }
    }

    @Test("a relay that owes an OFFSET and sends only PINGs is left after --retry-for from its last progress; one owed nothing is not")
    func progressDeadline() async throws {
        var h = AgentHarness(files: 2) { $0.retryFor = .seconds(15) }
        let start = h.now
        let ids = h.connect(connectionWindow: 8 << 20, streamWindow: 8 << 20)
        #expect(ids.count == 2)
        // The first OPEN is answered at 5 s: progress. The second never is; PINGs keep arriving.
        h.now = start + .seconds(5)
        h.receive(.offset(Frame.Offset(streamID: ids[0], disposition: .start, offset: 0)))
        h.now = start + .seconds(19)
        h.receive(.ping(Frame.Ping(data: 1)))
        #expect(!Self.closes(h.session.timerFired(.progress, now: h.now)), "14 s since the last progress")
        let late = h.session.timerFired(.progress, now: start + .seconds(20))
        #expect(Self.closes(late), "15 s since the OFFSET, an OPEN unanswered: \(late)")
        #expect(h.session.outcome.reason?.contains("answered nothing (OFFSET, ACK or RESULT) for 15") == true, "\(h.session.outcome)")

        // Streams that wait for their own source owe the relay nothing: no deadline.
        var quiet = AgentHarness(files: 1) { $0.retryFor = .seconds(15) }
        let id = quiet.connect(connectionWindow: 8 << 20, streamWindow: 8 << 20)[0]
        quiet.receive(.offset(Frame.Offset(streamID: id, disposition: .start, offset: 0)))
        let later = quiet.session.timerFired(.progress, now: quiet.now + .seconds(60))
        #expect(!Self.closes(later))
        #expect(later.contains { if case .schedule(.progress, _) = $0 { return true } else { return false } }, "checked again later")
        // Its source done a minute later, its HASH goes out: the relay has the whole timeout for the RESULT from then.
        quiet.session.senders[id]?.hashedSHA1 = try #require(SHA1Digest(bytes: [UInt8](repeating: 0, count: 20)))
        quiet.session.noteOwed(now: quiet.now + .seconds(61))
        #expect(!Self.closes(quiet.session.timerFired(.progress, now: quiet.now + .seconds(70))), "9 s since the HASH")
        #expect(Self.closes(quiet.session.timerFired(.progress, now: quiet.now + .seconds(76))), "15 s since the HASH, no RESULT")
    }

    @Test("a relay that has not sent WELCOME within the welcome timeout is left, however many bytes trickle in; a welcomed one is not")
    func welcomeDeadline() async {
        var h = AgentHarness(files: 1)
        let hello = h.session.connected(now: h.now)
        #expect(hello.contains { if case .schedule(.welcome, let delay) = $0 { return delay == .seconds(15) } else { return false } })
        h.session.received(ByteBuffer(bytes: [0]))
        #expect(Self.closes(h.session.timerFired(.welcome, now: h.now + .seconds(15))))
        #expect(h.session.outcome.reason?.contains("did not complete the handshake (WELCOME) within 15") == true, "\(h.session.outcome)")
        var welcomed = AgentHarness(files: 1)
        _ = welcomed.connect(connectionWindow: 8 << 20, streamWindow: 8 << 20)
        #expect(welcomed.session.timerFired(.welcome, now: welcomed.now + .seconds(15)).isEmpty)
    }

    @Test("50 OPENs refused within a second pause opening (the relay ends a connection at 100): a timer opens again")
    func refusalsPauseOpening() async {
        var h = AgentHarness(files: 8)
        _ = h.connect(connectionWindow: 8 << 20, streamWindow: 8 << 20)
        for _ in 0..<AgentSession.refusalLimit { h.session.openRefused(now: .now) }
        let paused = h.session.openMore()
        #expect(paused.allSatisfy { if case .schedule(.refusals, _) = $0 { return true } else { return false } } && paused.count == 1, "\(paused)")
        #expect(h.session.openMore().isEmpty, "one timer, however often it is asked")
        // A second later the refusals are old: it opens again.
        h.session.refusedOpens = h.session.refusedOpens.map { $0 - .seconds(2) }
        let again = h.session.timerFired(.refusals, now: .now)
        #expect(!again.contains { if case .schedule(.refusals, _) = $0 { return true } else { return false } }, "\(again)")
    }

    @Test("KEY_BUSY waits out a backoff, then the job is prepared again; it is not counted as an attempt")
    func keyBusyBacksOff() async {
        var h = AgentHarness(files: 1)
        let id = h.connect(connectionWindow: 8 << 20, streamWindow: 8 << 20)[0]
        let busy = h.receive(.error(Frame.Error(streamID: id, code: .keyBusy, message: "busy")))
        guard case .schedule(let timer, let delay)? = busy.first(where: { if case .schedule = $0 { return true } else { return false } }) else {
            Issue.record("no backoff scheduled: \(busy)")
            return
        }
        #expect(delay <= .seconds(2))
        #expect(h.jobs[0].attempts == 0)
        let again = h.session.timerFired(timer, now: .now)
        #expect(again.contains { if case .prepare = $0 { return true } else { return false } })
    }

    @Test("GOAWAY: streams above its last id go back to the queue; the connection closes once nothing is in flight")
    func goAwayRequeues() async {
        var h = AgentHarness(files: 2)
        let ids = h.connect(connectionWindow: 8 << 20, streamWindow: 8 << 20)
        let away = h.receive(.goAway(Frame.GoAway(lastStreamID: ids[0], code: .noError, message: "bye")))
        #expect(h.session.senders.keys.sorted() == [ids[0]])
        #expect(!away.contains { if case .close = $0 { return true } else { return false } })
        let stored = h.receive(.offset(Frame.Offset(streamID: ids[0], disposition: .stored, offset: 4 << 20)))
        #expect(stored.contains { if case .close = $0 { return true } else { return false } })
        #expect(h.queue.next()?.key == "k1", "the requeued job waits for the next connection")
    }

    @Test("a job whose preparation ends after its connection closed wakes the next connection (else it idles forever)")
    func latePreparationWakesNextConnection() async {
        let welcome = Frame.welcome(
            Frame.Welcome(
                version: 1, maxFrameSize: 1 << 20, features: [], maxStreams: 64, connectionWindow: 1 << 20,
                streamWindow: 1 << 20, maxKeyLength: 1024, idleTimeoutMillis: 120_000, account: "a"
            )
        )
        var old = AgentHarness(files: 1)
        _ = old.session.connected(now: .now)
        guard case .prepare(let job, _, _)? = old.receive(welcome).first(where: { if case .prepare = $0 { return true } else { return false } })
        else {
            Issue.record("no prepare")
            return
        }
        _ = old.session.connectionClosed()
        // The next connection is up with nothing to do (the job is still being prepared); then the preparation ends.
        var next = AgentSession(configuration: old.session.configuration, queue: old.queue)
        _ = next.connected(now: .now)
        next.received(FrameEncoder.encodeToBuffer(welcome))
        var opened: [AgentSession.Action] = []
        while let more = next.nextFrame(now: .now) { opened += more }
        #expect(!opened.contains { if case .prepare = $0 { return true } else { return false } })
        let woken = NIOLockedValueBox(0)
        old.queue.setListener(ObjectIdentifier(old.queue)) { woken.withLockedValue { $0 += 1 } }
        #expect(old.session.prepared(job, .success(SourceReader.Prepared(info: job.info!, sha1: nil))).isEmpty)
        #expect(woken.withLockedValue { $0 } == 1, "the queue tells the running connection")
        #expect(next.jobsChanged().contains { if case .prepare = $0 { return true } else { return false } })
    }

    @Test("the queue's listener survives any number of jobs coming back (soak seed 5511 round 16: the agent crashed at exit)")
    func queueListenerDoesNotGrow() async {
        let job = UploadJob(item: UploadItem(key: "k", displayPath: "k", source: FileSource(path: "/nonexistent")))
        let queue = JobQueue([job])
        let told = NIOLockedValueBox(0)
        queue.setListener(ObjectIdentifier(queue)) { told.withLockedValue { $0 += 1 } }
        for _ in 0..<300_000 {
            guard let next = queue.next() else { break }
            queue.requeue(next)
        }
        // Releasing the listener released a chain of conversion thunks one per access, recursively, past the stack.
        queue.setListener(ObjectIdentifier(queue), nil)
        #expect(told.withLockedValue { $0 } == 300_000)
    }

    @Test("a job the relay had no room for comes back to the line when its own wait ends: one deferred later for less is not held behind it")
    func deferredJobsComeBackInTheirOrder() async {
        let jobs = ["long", "short"].map { UploadJob(item: UploadItem(key: $0, displayPath: $0, source: FileSource(path: "/nonexistent"))) }
        let queue = JobQueue(jobs)
        // On a thread of its own: on a loaded run the cooperative pool's few threads may all be busy for seconds.
        let returning = Task(executorPreference: DispatchTaskExecutor()) { await queue.returnDeferredJobs() }
        defer { returning.cancel() }
        guard let long = queue.next(), let short = queue.next() else {
            Issue.record("both jobs start")
            return
        }
        queue.deferJob(long, for: .seconds(3600), reason: "QUOTA_EXCEEDED")
        // The returner is asleep until the long wait's end when the short one arrives.
        #expect(await Polling.waitUntil(timeout: 10) { queue.deferralWatch.parked == 1 })
        // Files that come and go meanwhile do not wake it: only a deferral does.
        let looks = queue.deferralWatch.looks
        for index in 0..<100 {
            queue.add([UploadJob(item: UploadItem(key: "other\(index)", displayPath: "o", source: FileSource(path: "/nonexistent")))])
            if let other = queue.next() { _ = queue.finished(other, other.finish(.stored, sha1: "")) }
        }
        #expect(queue.deferralWatch.looks == looks && queue.deferralWatch.parked == 1)
        queue.deferJob(short, for: .milliseconds(20), reason: "STORAGE_FULL")
        #expect(await Polling.waitUntil(timeout: 10) { queue.hasWaiting })
        #expect(queue.next()?.key == "short")
        #expect(queue.next() == nil && !queue.isDone, "the long one still waits for room")
        returning.cancel()
        await returning.value
    }

    @Test("--connections: every running connection hears that a job came back, and one that closed hears nothing more")
    func everyConnectionIsTold() async {
        let jobs = (0..<2).map { UploadJob(item: UploadItem(key: "k\($0)", displayPath: "k\($0)", source: FileSource(path: "/nonexistent"))) }
        let queue = JobQueue(jobs)
        final class Owner: Sendable {}
        let (first, second) = (Owner(), Owner())
        let told = NIOLockedValueBox([0, 0])
        queue.setListener(ObjectIdentifier(first)) { told.withLockedValue { $0[0] += 1 } }
        queue.setListener(ObjectIdentifier(second)) { told.withLockedValue { $0[1] += 1 } }
        if let job = queue.next() { queue.requeue(job) }
        #expect(told.withLockedValue { $0 } == [1, 1])
        queue.setListener(ObjectIdentifier(first), nil)
        if let job = queue.next() { queue.requeue(job) }
        #expect(told.withLockedValue { $0 } == [1, 2])
    }

    @Test(
        "stripes in the queue: dropping the key drops the main job, not a stripe; giving up the waiting jobs fails the striped upload they belong to")
    func stripesInTheQueue() async throws {
        let main = UploadJob(item: UploadItem(key: "v.mov", displayPath: "v.mov", source: FileSource(path: "/nonexistent")))
        main.info = SourceInfo(size: 40 << 20, fingerprint: [1])
        main.striped = true
        let other = UploadJob(item: UploadItem(key: "w.mov", displayPath: "w.mov", source: FileSource(path: "/nonexistent")))
        let queue = JobQueue([main, other])
        #expect(queue.next() === main)
        let set = StripeSet(token: [7], size: 40 << 20)
        main.stripes = set
        queue.addStripes((1..<set.stripes.count).map { UploadJob(stripe: $0, of: main, set: set) })
        // The main job is active, its stripes wait first in line: the drop marks the main job, and removes nothing.
        #expect(queue.drop(key: "v.mov", reason: "deleted") == nil)
        #expect(queue.dropReason(main) == "deleted")
        let stripe = try #require(queue.next())
        #expect(stripe.stripe?.index == 1)
        queue.requeue(stripe)
        let failed = queue.failWaiting("the relay is unreachable", code: UploadResult.ErrorCode.relayUnreachable)
        #expect(failed.map(\.key) == ["w.mov"], "stripes are the agent's own, never reported")
        #expect(set.failure?.contains("the relay is unreachable") == true, "the main job, still active, learns its stripes are gone")
    }

    @Test("keepalive: one silent period sends PING, the second takes the link for dead")
    func keepalive() async {
        var h = AgentHarness(files: 1)
        _ = h.connect(connectionWindow: 8 << 20, streamWindow: 8 << 20)
        #expect(AgentHarness.frames(h.session.silentPeriod()).map(\.type) == [.ping])
        let dead = h.session.silentPeriod()
        #expect(dead.contains { if case .close = $0 { return true } else { return false } })
        let closed = h.session.connectionClosed()
        guard case .finished(let outcome)? = closed.last else {
            Issue.record("no outcome")
            return
        }
        #expect(outcome.reason?.contains("the link is dead") == true)
        #expect(h.queue.next() != nil, "the job in flight went back to the queue")
    }

    /// Seeded: reads finish in random orders and sizes while the relay grants credit in random amounts; no CHUNK is
    /// ever refused for credit (the reservation covers it), and every stream's chunks are contiguous.
    @Test("random read completions and credit never overrun a window", arguments: 0..<30)
    func randomCredit(round: Int) async {
        let seed = UInt64(0xA6E7_0000) + UInt64(round)
        var rng = SeededGenerator(seed: seed)
        var h = AgentHarness(files: Int.random(in: 1...5, using: &rng), size: UInt64.random(in: 1...(3 << 20), using: &rng))
        let window = UInt32.random(in: 1...(4 << 20), using: &rng)
        let ids = h.connect(connectionWindow: window, streamWindow: UInt32.random(in: 1...(4 << 20), using: &rng))
        var pending: [SourceReader.Request] = []
        var next: [StreamID: UInt64] = [:]
        func absorb(_ actions: [AgentSession.Action]) {
            pending += AgentHarness.reads(actions)
            for frame in AgentHarness.frames(actions) {
                if case .chunk(let chunk) = frame {
                    #expect(chunk.offset == next[chunk.streamID, default: 0], "seed \(seed): chunks of \(chunk.streamID) not contiguous")
                    next[chunk.streamID] = chunk.offset + UInt64(chunk.payloadLength)
                }
            }
            for action in actions {
                if case .event(.finished(let result)) = action {
                    #expect(result.status != .failed, "seed \(seed): \(result.error ?? "")")
                }
            }
        }
        for id in ids {
            absorb(h.receive(.offset(Frame.Offset(streamID: id, disposition: .start, offset: 0))))
        }
        for _ in 0..<300 {
            if Bool.random(using: &rng), !pending.isEmpty {
                let request = pending.remove(at: Int.random(in: 0..<pending.count, using: &rng))
                let remaining = Int(clamping: (h.jobs[0].info?.size ?? 0) - request.offset)
                let bytes = min(request.budget, Int.random(in: 0...request.budget, using: &rng), remaining)
                absorb(h.session.readFinished(request.streamID, .success(AgentHarness.batch(request, bytes: bytes, ended: bytes == remaining))))
            } else if let id = ids.randomElement(using: &rng) {
                let grant = UInt32.random(in: 1...(1 << 20), using: &rng)
                absorb(h.receive(.credit(Frame.Credit(streamID: Bool.random(using: &rng) ? .connection : id, increment: grant))))
            }
        }
    }
}
