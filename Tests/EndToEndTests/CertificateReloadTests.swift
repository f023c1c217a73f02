import Foundation
import Testing
import UploadRelay
import UploadTestSupport

/// SIGHUP to `upload-relay serve`: a renewed certificate is taken without a restart and without dropping anyone.
@Suite("End to end: certificate reload")
struct CertificateReloadTests {
    @Test(
        "SIGHUP: new connections get the renewed certificate (the old CA no longer verifies it), an upload under way on the old one goes on and is stored; unreadable files keep the old certificate"
    )
    func reloadOnHangup() async throws {
        let home = TestRelay.makeDirectory()
        defer { try? FileManager.default.removeItem(atPath: home) }
        // Two certificate sets from two CAs: the relay serves the files in home/live, first from the one, then the other.
        let first = DevCertificates.Paths(dataDirectory: home + "/first")
        let second = DevCertificates.Paths(dataDirectory: home + "/second")
        for paths in [first, second] {
            try FileManager.default.createDirectory(atPath: paths.directory, withIntermediateDirectories: true)
            try DevCertificates.ensure(paths)
        }
        let live = home + "/live"
        try FileManager.default.createDirectory(atPath: live, withIntermediateDirectories: true)
        func install(_ paths: DevCertificates.Paths) throws {
            for (from, to) in [(paths.serverCertificate, live + "/cert.pem"), (paths.serverKey, live + "/key.pem")] {
                try? FileManager.default.removeItem(atPath: to + ".new")
                try FileManager.default.copyItem(atPath: from, toPath: to + ".new")
                _ = rename(to + ".new", to)
            }
        }
        try install(first)
        let data = home + "/data"
        let relay = try ChildProcess(
            try relayBinary(),
            [
                "serve", "--data", data, "--cert", live + "/cert.pem", "--key", live + "/key.pem", "--listen", "127.0.0.1:0",
                "--ready-file", home + "/ready", "--log-level", "info",
            ],
            readyFile: home + "/ready", logFile: home + "/relay.log"
        )
        defer {
            relay.kill(SIGTERM)
            _ = relay.waitForExit()
        }
        let port = try await relay.waitUntilReady()
        let add = try await CommandLineTests.run(try relayBinary(), ["token", "add", "cam", "--data", data])
        let token = add.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(add.status == 0 && token.hasPrefix("upl_"), "\(add.stderr)")
        let environment = ["UPLOAD_RELAY": "127.0.0.1:\(port)", "UPLOAD_TOKEN": token]
        func send(_ file: String, ca: String) async throws -> (status: Int32, stdout: String, stderr: String) {
            let run = try await CommandLineTests.run(
                try CommandLineTests.agentBinary(), ["send", "--json", "--no-state", "--retry-for", "2s", "--ca", ca, file], environment: environment
            )
            return (run.status, run.stdout, run.stderr)
        }

        // An upload under way on a connection made with the first certificate, throttled so that it spans the reload
        // (6 s at 1 MB/s: a machine busy with the whole suite still sees it under way).
        let large = makeFile(home, "large.mov", size: 6 << 20, seed: 3)
        let uploading = try AgentProcess(
            ["send", "--json", "--no-state", "--bwlimit", "1M", "--ca", first.caCertificate, large.path], environment: environment,
            log: home + "/large.log"
        )
        defer { uploading.stop(SIGKILL) }
        #expect(
            try await AgentProcess.waitUntil {
                try CommandLineTests.runNow(try relayBinary(), ["ls", "--in-progress", "--json", "--data", data]).stdout.contains("large.mov")
            }, "\(uploading.child.log)"
        )

        try install(second)
        relay.kill(SIGHUP)
        await #expect(AgentProcess.waitUntil { relay.log.contains("certificate reloaded") }, "\(relay.log)")
        let small = makeFile(home, "small.jpg", size: 20_000, seed: 4)
        let withSecond = try await send(small.path, ca: second.caCertificate)
        #expect(withSecond.status == 0, "the renewed certificate is not served: \(withSecond.stderr)")
        let withFirst = try await send(small.path, ca: first.caCertificate)
        #expect(withFirst.status == 3 && withFirst.stdout.contains("\"error_code\":\"TLS_UNTRUSTED\""), "\(withFirst.stdout) \(withFirst.stderr)")

        // The upload on the old connection was never dropped.
        #expect(await uploading.child.exited() == 0, "\(uploading.child.log)")
        #expect(FileManager.default.contents(atPath: data + "/store/cam/large.mov") == large.data)
        #expect(!uploading.child.log.contains("resuming"), "the upload was cut and resumed: \(uploading.child.log)")

        // A renewal that cannot be read: said in the log, and the certificate in use stays.
        try Data("not a certificate".utf8).write(to: URL(fileURLWithPath: live + "/cert.pem"))
        relay.kill(SIGHUP)
        await #expect(AgentProcess.waitUntil { relay.log.contains("could not reload the certificate") }, "\(relay.log)")
        let after = try await send(small.path, ca: second.caCertificate)
        #expect(after.status == 0, "\(after.stderr)")
    }
}
