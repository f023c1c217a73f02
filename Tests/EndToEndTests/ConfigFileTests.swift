import Foundation
import Testing
import UploadTestSupport

/// `--config FILE` and `--bwlimit`, through the agent binary against a relay in this process.
@Suite("End to end: config file and bandwidth limit", .serialized)
struct ConfigFileTests {
    /// Writes a configuration only its owner may change (0644), whatever the umask: the programs refuse others.
    func write(_ object: [String: Any], to path: String) throws {
        try JSONSerialization.data(withJSONObject: object).write(to: URL(fileURLWithPath: path))
        chmod(path, 0o644)
    }

    @Test("options come from the file; the command line overrides them; a section holds a command's own")
    func fileAndOverride() async throws {
        let relay = try await TestRelay().start()
        let home = TestRelay.makeDirectory()
        let file = makeFile(home, "notes.txt", size: 70_000, seed: 4)
        let config = home + "/agent.json"
        try self.write(
            [
                "relay": "127.0.0.1:\(relay.port)", "token": "not-the-token", "ca": relay.caPath, "state": home + "/state",
                "concurrency": 3, "no-dedup": false, "send": ["json": true, "retry-for": "5s"], "watch": ["settle": "1s"],
            ],
            to: config
        )
        let agent = try CommandLineTests.agentBinary()
        // The file's token is wrong: the run fails for it (exit 3: nothing went up, the account refused), so the file was read.
        let refused = try await CommandLineTests.run(agent, ["send", "--config", config, file.path])
        #expect(refused.status == 3, "\(refused.stderr)")
        #expect(refused.stderr.contains("UNAUTHENTICATED"), "\(refused.stderr)")
        // The command line's token wins; --json comes from the "send" section.
        let run = try await CommandLineTests.run(agent, ["send", "--config=\(config)", "--token", relay.token, file.path])
        #expect(run.status == 0, "\(run.stderr)")
        let line = try #require(try JSONSerialization.jsonObject(with: Data(run.stdout.utf8)) as? [String: Any], "\(run.stdout)")
        #expect(line["status"] as? String == "stored")
        #expect(relay.stored("notes.txt") == file.data)
        // "state" reaches status too; the queue it shows is the file's state directory.
        let status = try await CommandLineTests.run(agent, ["status", "--config", config, "--all", "--json"])
        #expect(status.status == 0, "\(status.stderr)")
        #expect(status.stdout.contains("notes.txt"), "\(status.stdout)")
        await relay.stop()
    }

    @Test("a bad file is a usage error that names the file and the fix", arguments: ["missing", "not-json", "misplaced"])
    func badFile(kind: String) async throws {
        let home = TestRelay.makeDirectory()
        let config = home + "/agent.json"
        switch kind {
        case "not-json": try Data("relay = 1".utf8).write(to: URL(fileURLWithPath: config))
        case "misplaced": try self.write(["settle": "3s"], to: config)
        default: break
        }
        let run = try await CommandLineTests.run(try CommandLineTests.agentBinary(), ["send", "--config", config, "x"])
        #expect(run.status == 2)
        #expect(run.stderr.contains(config), "\(run.stderr)")
        if kind == "misplaced" { #expect(run.stderr.contains("{\"watch\": {\"settle\""), "\(run.stderr)") }
    }

    @Test("Examples/upload-agent.json, which sets every option, parses for send and watch")
    func sampleFile() async throws {
        let sample = packageRoot + "/Examples/upload-agent.json"
        let agent = try CommandLineTests.agentBinary()
        // The file was read when what stops the command is the command line itself: no paths, no such directory.
        let send = try await CommandLineTests.run(agent, ["send", "--config", sample])
        #expect(send.status == 2)
        #expect(send.stderr.contains("Missing expected argument '<path> ...'"), "\(send.stderr)")
        #expect(!send.stderr.contains(sample), "\(send.stderr)")
        let watch = try await CommandLineTests.run(agent, ["watch", "--config", sample, "/nonexistent-directory"])
        #expect(watch.status == 2)
        #expect(watch.stderr.contains("not a directory"), "\(watch.stderr)")
    }

    @Test("--bwlimit 1M: 3 MiB take at least 2.5 s (a quarter second's burst, then the rate), and arrive whole")
    func bandwidthLimit() async throws {
        let relay = try await TestRelay().start()
        let home = TestRelay.makeDirectory()
        let file = makeFile(home, "video.mp4", size: 3 << 20, seed: 5)
        let environment = AgentProcess.environment(relay, state: home + "/state")
        let started = ContinuousClock.now
        let run = try await CommandLineTests.run(
            try CommandLineTests.agentBinary(), ["send", "--bwlimit", "1M", "--no-state", file.path], environment: environment)
        let elapsed = ContinuousClock.now - started
        #expect(run.status == 0, "\(run.stderr)")
        #expect(elapsed >= .milliseconds(2500), "\(elapsed)")
        #expect(relay.stored("video.mp4") == file.data)
        let invalid = try await CommandLineTests.run(
            try CommandLineTests.agentBinary(), ["send", "--bwlimit", "0", file.path], environment: environment)
        #expect(invalid.status == 2)
        #expect(invalid.stderr.contains("--bwlimit"))
        await relay.stop()
    }

    @Test(
        "upload-relay serve runs from a configuration file alone, its catalog URL read from a file (PostgreSQL when the tests have one) and never on its command line; UPLOAD_RELAY_* overrides the file, the command line both; a key no option has is a usage error"
    )
    func relayFromFile() async throws {
        // A database of its own: another run's objects under the same keys would make this upload "already there".
        if ProcessInfo.processInfo.environment["UPLOAD_TEST_POSTGRES_URL"] == nil {
            try await self.relayFromFile(catalogURL: nil)
        } else {
            try await PostgresTestDatabase.with { url in try await self.relayFromFile(catalogURL: url) }
        }
    }

    private func relayFromFile(catalogURL: String?) async throws {
        let home = TestRelay.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: home) }
        let data = home + "/data"
        var object: [String: Any] = [
            "data": data, "dev": true, "listen": "127.0.0.1:0", "ready-file": home + "/ready", "log-level": "warning",
            "min-free": "1M", "metrics-listen": 0, "dev-host": ["relay.example", "relay2.example"],
        ]
        if let catalogURL {
            try Data((catalogURL + "\n").utf8).write(to: URL(fileURLWithPath: home + "/catalog-url"))
            chmod(home + "/catalog-url", 0o600)
            object["catalog-file"] = home + "/catalog-url"
        }
        try self.write(object, to: home + "/relay.json")
        // The environment overrides the file: info lines, though the file says warning.
        var environment = ProcessInfo.processInfo.environment
        environment["UPLOAD_RELAY_LOG_LEVEL"] = "info"
        // A list from the environment replaces the file's, not adds to it.
        environment["UPLOAD_RELAY_DEV_HOST"] = "relay3.example"
        let relay = try ChildProcess(
            try relayBinary(), ["serve", "--config", home + "/relay.json"], readyFile: home + "/ready", logFile: home + "/relay.log",
            environment: environment
        )
        defer {
            relay.kill(SIGTERM)
            _ = relay.waitForExit()
        }
        let port = try await relay.waitUntilReady()
        let commandLine = try String(contentsOfFile: "/proc/\(relay.process.processIdentifier)/cmdline", encoding: .utf8)
        if let catalogURL {
            #expect(!commandLine.contains(catalogURL), "the catalog URL is on the relay's command line")
            #expect(!relay.log.contains(catalogURL), "the catalog URL is in the relay's log")
        }
        #expect(relay.log.contains("certificate for: localhost, 127.0.0.1, ::1, relay3.example\n"), "the environment's dev-host: \(relay.log)")
        #expect(relay.log.contains("info upload-relay"), "UPLOAD_RELAY_LOG_LEVEL did not override the file: \(relay.log)")
        let token = try String(contentsOfFile: data + "/dev/token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let file = makeFile(home, "clip.mp4", size: 3 << 20, seed: 12)
        let sent = try await CommandLineTests.run(
            try CommandLineTests.agentBinary(),
            ["send", "--json", "--no-state", "--relay", "127.0.0.1:\(port)", "--ca", data + "/dev/ca.pem", "--token", token, file.path]
        )
        #expect(sent.status == 0, "\(sent.stderr)")
        #expect(FileManager.default.contents(atPath: data + "/store/dev/clip.mp4") == file.data)
        if let catalogURL {
            // The object is in the PostgreSQL catalog: `ls` with the same URL lists it.
            let listed = try await CommandLineTests.run(try relayBinary(), ["ls", "--json", "--data", data, "--catalog", catalogURL])
            #expect(listed.stdout.contains("clip.mp4"), "\(listed.stdout) \(listed.stderr)")
        }

        try self.write(["data": data, "listen-addr": "127.0.0.1:0"], to: home + "/bad.json")
        let bad = try await CommandLineTests.run(try relayBinary(), ["serve", "--config", home + "/bad.json"])
        #expect(bad.status == 2)
        #expect(bad.stderr.contains("\"listen-addr\" is not an option of upload-relay serve"), "\(bad.stderr)")
        let unreadable = try await CommandLineTests.run(
            try relayBinary(), ["serve", "--config", home + "/relay.json", "--catalog-file", home + "/none"])
        #expect(unreadable.status == 2)
        #expect(unreadable.stderr.contains("--catalog-file: cannot read \(home)/none"), "\(unreadable.stderr)")
    }

    @Test(
        "configuration taken as sshd's StrictModes takes it: a --config others can change, a secret's file every user can read, and a directory anyone can write are refused; a file's value is never echoed; a typo in UPLOAD_RELAY_* is named"
    )
    func strictConfiguration() async throws {
        let home = TestRelay.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: home) }
        let relay = try relayBinary()
        let config = home + "/relay.json"
        try self.write(["data": home + "/data", "dev": true, "listen": "127.0.0.1:0"], to: config)
        func serve(_ arguments: [String], environment: [String: String] = [:]) async throws -> CommandLineTests.Run {
            try await CommandLineTests.run(relay, ["serve"] + arguments, environment: environment)
        }
        chmod(config, 0o666)
        let writable = try await serve(["--config", config])
        #expect(writable.status == 2)
        #expect(
            writable.stderr.contains("--config \(config) can be changed by users other than its owner (mode 0666); chmod go-w"), "\(writable.stderr)")
        chmod(config, 0o644)
        let open = home + "/open"
        try FileManager.default.createDirectory(atPath: open, withIntermediateDirectories: true)
        chmod(open, 0o777)
        try self.write(["data": home + "/data"], to: open + "/relay.json")
        let inOpen = try await serve(["--config", open + "/relay.json"])
        #expect(inOpen.status == 2)
        #expect(inOpen.stderr.contains("which users other than its owner can write (mode 0777)"), "\(inOpen.stderr)")

        let secret = home + "/catalog-url"
        try Data("postgres://u:hunter2@127.0.0.1:1/db\n".utf8).write(to: URL(fileURLWithPath: secret))
        chmod(secret, 0o644)
        let readable = try await serve(["--config", config, "--catalog-file", secret])
        #expect(readable.status == 2)
        #expect(readable.stderr.contains("holds a secret that every user can read (mode 0644); chmod o-r"), "\(readable.stderr)")
        #expect(!readable.stderr.contains("hunter2"))

        // A value read from a file that does not parse is named by its file, never shown.
        let listen = home + "/listen"
        try Data("root:$6$notahash:19000:0:99999:7:::\n".utf8).write(to: URL(fileURLWithPath: listen))
        chmod(listen, 0o600)
        let shown = try await serve(["--config", config, "--listen-file", listen])
        #expect(shown.status == 2)
        #expect(!shown.stderr.contains("notahash"), "\(shown.stderr)")
        #expect(shown.stderr.contains("(the content of \(listen))"), "\(shown.stderr)")

        // A catalog URL that cannot be used is shown without its password, however it is malformed.
        for url in ["postgres://u:hunter2@host:notaport/db", "postgre://u:hunter2@h/db", "postgres://u:hunter2@/db", "mysql://u:hunter2@h/db"] {
            let bad = try await serve(["--config", config, "--catalog", url])
            #expect(bad.status != 0)
            #expect(!bad.stderr.contains("hunter2"), "\(url): \(bad.stderr)")
        }

        // UPLOAD_RELAY_* one or two letters from an option is refused and named, as the same typo in the file is.
        let typo = try await serve(["--config", config], environment: ["UPLOAD_RELAY_MIN_FRE": "2G"])
        #expect(typo.status == 2)
        #expect(
            typo.stderr.contains("UPLOAD_RELAY_MIN_FRE is not an option of upload-relay serve: did you mean UPLOAD_RELAY_MIN_FREE?"), "\(typo.stderr)"
        )
    }

    @Test("SIGHUP while the relay waits for its catalog does not end it: it goes on to its own outcome")
    func hangupBeforeReady() async throws {
        let home = TestRelay.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: home) }
        // A "PostgreSQL" that accepts and never answers: the relay waits for it.
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(listener) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(listener, $0, length) == 0 && listen(listener, 8) == 0 && getsockname(listener, $0, &length) == 0
            }
        }
        try #require(bound)
        let port = Int(UInt16(bigEndian: address.sin_port))
        let relay = try ChildProcess(
            try relayBinary(),
            [
                "serve", "--dev", "--data", home + "/data", "--listen", "127.0.0.1:0", "--ready-file", home + "/ready", "--catalog",
                "postgres://u:p@127.0.0.1:\(port)/db?sslmode=disable",
            ],
            readyFile: home + "/ready", logFile: home + "/relay.log"
        )
        defer {
            relay.kill(SIGKILL)
            _ = relay.waitForExit()
        }
        // Once the relay has connected to the silent server, it is waiting for its catalog: then the signal.
        var waiting = pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
        try #require(poll(&waiting, 1, 30_000) == 1, "the relay never connected to its catalog")
        let connection = accept(listener, nil, nil)
        defer { if connection >= 0 { close(connection) } }
        relay.kill(SIGHUP)
        let status = relay.waitForExit()
        #expect(relay.process.terminationReason == .exit, "ended by a signal (\(status)): \(relay.log)")
        #expect(status == 2, "\(relay.log)")
        #expect(relay.log.contains("--catalog"), "\(relay.log)")
    }
}
