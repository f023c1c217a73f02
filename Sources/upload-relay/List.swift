import ArgumentParser
import Foundation
import UploadCommandLine
import UploadRelay
import UploadRelayBackends

/// `upload-relay ls`: what the catalog holds, stored and under way (uploads in progress are visible to every client of
/// the account).
struct ListCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ls",
        abstract: "List stored objects and uploads under way, with their bytes.",
        discussion: """
            Reads the catalog (<data>/catalog.sqlite, or the shared one of --catalog), so it sees what \
            every relay sharing it stores. An upload under way shows the bytes the relay holds durably \
            (what an agent resuming it would not send again) and the size it announced. \
            With --json, one object per line: {"account", "key", "status": "stored"|"uploading", \
            "bytes", "size", "sha1" (stored only)}.
            """
    )

    @Option(name: .long, help: ArgumentHelp("Only this account's.", valueName: "name"))
    var account: String?

    @Flag(name: .long, help: "Only uploads under way.")
    var inProgress = false

    @Flag(name: .long, help: "One JSON object per line, for scripts (bytes always exact there).")
    var json = false

    @Flag(name: .long, help: "Exact byte counts in the table instead of KiB, MiB, GiB.")
    var bytes = false

    @OptionGroup var options: Token.Options

    struct Entry: Encodable {
        var account: String
        var key: String
        var status: String
        var bytes: Int64
        var size: Int64?
        var sha1: String?
    }

    func run() async throws {
        let catalog = try await self.options.openCatalog()
        if let account = self.account, try await catalog.account(named: account) == nil {
            throw ValidationError(CatalogError.unknownAccount(account).description)
        }
        var entries: [Entry] = []
        if !self.inProgress {
            for object in try await catalog.objects() where self.account == nil || object.account == self.account {
                entries.append(
                    Entry(account: object.account, key: object.key, status: "stored", bytes: object.size, size: object.size, sha1: object.sha1))
            }
        }
        for session in try await catalog.sessions(updatedBefore: .distantFuture) where self.account == nil || session.account == self.account {
            entries.append(
                Entry(
                    account: session.account, key: session.key, status: "uploading", bytes: session.durableOffset, size: session.declaredSize,
                    sha1: nil)
            )
        }
        entries.sort { ($0.account, $0.key, $0.status) < ($1.account, $1.key, $1.status) }
        if self.json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            for entry in entries {
                print(String(decoding: try encoder.encode(entry), as: UTF8.self))
            }
            return
        }
        let shown: (Int64) -> String = self.bytes ? { String($0) } : { Format.bytes($0) }
        print("ACCOUNT\tSTATUS\tBYTES\tSIZE\tKEY")
        for entry in entries {
            print("\(entry.account)\t\(entry.status)\t\(shown(entry.bytes))\t\(entry.size.map(shown) ?? "-")\t\(entry.key)")
        }
    }
}
