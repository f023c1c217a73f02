import ArgumentParser

@main
struct UploadAgentCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "upload-agent",
        abstract: "Upload files to an upload-relay: streamed, resumable, verified, never twice.",
        discussion: """
            Example:
              upload-agent send --relay relay.example.net:7443 --token "$TOKEN" --ca ca.pem ~/Pictures
            """,
        subcommands: [Send.self]
    )
}
