"""A roleplay transcript for `real_model.py`: two sessions a day apart, three characters (Kai the
player, Mira the guide, Tomas the ferryman), a secret (Tomas sank the ferry on the Ash Guild's
orders), quotable lines, and a place (Greywater crossing, the Drowned Chapel) and a faction (the
Ash Guild) introduced in play. Written for this benchmark; 104 messages."""

from __future__ import annotations

CAST = {
    "kai": {"name": "Kai", "is_player": True},
    "mira": {"name": "Mira", "aliases": ["Mi"]},
    "tomas": {"name": "Tomas", "aliases": ["the ferryman"]},
}
SECRET = {"character": "tomas", "text": "Tomas sank the Greywater ferry himself, on the Ash Guild's orders."}

SESSION_1 = [
    ("kai", "We finally reach the river. Where is the ferry, Mira? The map says Greywater crossing."),
    ("mira", "*Mira shades her eyes and looks across the brown water.* \u201cThere should be a ferry here. "
             "There has been a ferry at Greywater for two hundred years.\u201d"),
    ("kai", "There's only a broken pier and an old man mending nets."),
    ("tomas", "*The old man does not look up from his nets.* \u201cIf you want to cross, you swim or you wait. "
              "The ferry sank last winter.\u201d"),
    ("mira", "\u201cSank? The Greywater ferry was the size of a barn,\u201d Mira says."),
    ("tomas", "\u201cBarns burn, ferries sink. I am Tomas. I was its ferryman for thirty years.\u201d"),
    ("kai", "I'm Kai. We need to reach the Saltmarsh before the new moon. Is there another boat?"),
    ("tomas", "*He finally looks up, squinting at Kai.* \u201cThere is my skiff. It holds two, three if nobody "
              "breathes.\u201d"),
    ("mira", "\u201cWe can pay,\u201d Mira says, and jingles her purse."),
    ("tomas", "\u201cSilver does not row a boat. Come back at dawn, when the current is slow.\u201d"),
    ("kai", "What happened to the ferry, Tomas? A boat that size doesn't just sink."),
    ("tomas", "*His hands stop on the net for a moment.* \u201cThe river took it. The river takes what it wants.\u201d"),
    ("mira", "*Mira leans close to Kai and whispers.* \u201cHe is lying. Look at his hands.\u201d"),
    ("kai", "I saw. Let's not push him tonight. We need that skiff."),
    ("mira", "\u201cFine. But I do not trust a man who will not look at the water he worked for thirty years.\u201d"),
    ("tomas", "\u201cThere is a chapel up the bank, the Drowned Chapel. Travellers sleep there. Nobody will bother you.\u201d"),
    ("kai", "Why is it called the Drowned Chapel?"),
    ("tomas", "\u201cBecause the river rose once and the priests stayed to pray. Now it is dry and empty. Mostly.\u201d"),
    ("mira", "\u201cMostly,\u201d Mira repeats. \u201cI love that word.\u201d"),
    ("kai", "We walk up the bank to the chapel. I light a lantern inside."),
    ("mira", "*Mira runs a finger over the altar and frowns at the soot.* \u201cSomeone burned something here. "
             "Recently. Look, ashes in the shape of a hand.\u201d"),
    ("kai", "A hand? Like a sign?"),
    ("mira", "\u201cThe Ash Guild marks its meeting places that way. Smugglers, mostly. They own half the river "
             "trade south of here.\u201d"),
    ("kai", "Then the Ash Guild was here, and not long ago. Do you think they have something to do with the ferry?"),
    ("mira", "\u201cI think a ferry that carried everyone for free was bad for smugglers who charge for crossing.\u201d"),
    ("kai", "I promise you, Mira, we will find out what happened here before we leave."),
    ("mira", "*She smiles for the first time that day.* \u201cI will hold you to that, Kai.\u201d"),
    ("kai", "I take the first watch. Get some sleep."),
    ("mira", "\u201cWake me if the ashes start to move,\u201d she says, and rolls into her blanket."),
    ("kai", "Around midnight I hear footsteps outside the chapel. I shade the lantern and look."),
    ("tomas", "*Tomas stands at the door with a sack over his shoulder.* \u201cPut the light out. They watch the "
              "chapel at night.\u201d"),
    ("kai", "Who watches it? What's in the sack?"),
    ("tomas", "\u201cBread and dried fish. For the morning. You will need it on the marsh.\u201d"),
    ("kai", "That's kind of you. You didn't answer the first question."),
    ("tomas", "\u201cNo, I did not.\u201d *He sets the sack down and leaves without another word.*"),
    ("mira", "*Mira is awake, watching from her blanket.* \u201cHe came all this way to bring fish? Guilty men are "
             "generous.\u201d"),
    ("kai", "Or kind men are frightened. Either way, he's hiding something."),
    ("mira", "\u201cThen tomorrow we find out what.\u201d"),
    ("kai", "At dawn we go down to the pier. The skiff is waiting."),
    ("tomas", "\u201cThe current is slow. Get in, and sit still. The river does not like guests who dance.\u201d"),
    ("mira", "\u201cI never dance before breakfast,\u201d Mira says, climbing in."),
    ("kai", "Halfway across I see something under the water. A dark shape, long as a house."),
    ("tomas", "*He rows harder and does not look down.* \u201cDo not stare at it. It is only the old ferry.\u201d"),
    ("kai", "Its hull has a hole in it. A clean one. That wasn't a rock."),
    ("mira", "\u201cThat was an axe,\u201d Mira says quietly."),
    ("tomas", "\u201cThe river takes what it wants,\u201d Tomas says again, but his voice shakes."),
    ("kai", "We reach the far bank. I thank Tomas and pay him anyway."),
    ("tomas", "\u201cIf you come back this way, come alone. And do not sleep in the chapel again.\u201d"),
    ("mira", "\u201cThat sounded like a warning,\u201d Mira says as he rows away."),
    ("kai", "It was. We head into the Saltmarsh. We'll find the ferry's story when we return."),
    ("mira", "\u201cNew moon in four days. Let us not waste them.\u201d"),
    ("kai", "We walk until dark and make camp on a dry hummock."),
]

SESSION_2 = [
    ("kai", "Four days later we come back to Greywater crossing, muddy and tired. The pier is empty."),
    ("mira", "\u201cNo skiff, no nets, no Tomas,\u201d Mira says. \u201cI do not like this.\u201d"),
    ("kai", "There's smoke coming from the Drowned Chapel."),
    ("mira", "*Mira draws her knife.* \u201cThe Ash Guild again. Stay low.\u201d"),
    ("kai", "We creep up the bank and look through a broken window."),
    ("mira", "\u201cThree of them, and Tomas is tied to a pillar,\u201d she whispers."),
    ("kai", "I pick up a stone and throw it against the far wall to draw them out."),
    ("mira", "*When the smugglers run to the noise, Mira slips through the door and cuts Tomas free.*"),
    ("tomas", "\u201cYou came back,\u201d Tomas gasps. \u201cI told you to come alone.\u201d"),
    ("mira", "\u201cYou are welcome,\u201d Mira says dryly. \u201cNow run.\u201d"),
    ("kai", "We run down to the river and hide under the broken pier until the shouting stops."),
    ("tomas", "*Tomas is shaking, rubbing his wrists.* \u201cThey wanted to know what I told you.\u201d"),
    ("kai", "What did you tell us, Tomas? Nothing. So tell us now."),
    ("tomas", "*He is silent for a long time, staring at the water.*"),
    ("mira", "\u201cThe hole in the hull was made by an axe. We saw it,\u201d Mira says."),
    ("tomas", "\u201cYes. My axe.\u201d *He closes his eyes.* \u201cI sank the ferry myself. The Ash Guild paid me, and "
              "they said they would burn my daughter's house if I refused.\u201d"),
    ("kai", "You sank the ferry for the Ash Guild."),
    ("tomas", "\u201cSo every traveller must pay their boats to cross. Thirty years I carried people for free, and in "
              "one night I sold it all.\u201d"),
    ("mira", "*Mira's face is hard, then softens.* \u201cThey threatened your daughter. That is not selling, Tomas. "
             "That is being robbed.\u201d"),
    ("kai", "Mira, you promised nothing to him. But I promised you we'd find out what happened. Now we know."),
    ("mira", "\u201cYou kept your promise, Kai. Now what do we do with it?\u201d"),
    ("kai", "We go to the magistrate in Harrowgate and tell her about the Ash Guild."),
    ("tomas", "\u201cThe magistrate drinks with the Guild. You would be telling the fox about the henhouse.\u201d"),
    ("mira", "\u201cThen we need proof she cannot ignore,\u201d Mira says. \u201cTheir ledgers. Smugglers always keep ledgers.\u201d"),
    ("tomas", "\u201cThey keep them in the chapel crypt. Under the altar with the ash hand.\u201d"),
    ("kai", "Then tonight we go back into the Drowned Chapel."),
    ("mira", "\u201cWe just escaped from it,\u201d Mira says. \u201cYou have a gift for bad ideas.\u201d"),
    ("kai", "It's a good bad idea."),
    ("tomas", "\u201cI will come. It is my debt to pay.\u201d"),
    ("kai", "At midnight we climb the bank again. The smugglers are asleep around a fire outside."),
    ("mira", "*Mira counts them on her fingers.* \u201cFive now. Two more came from the south.\u201d"),
    ("kai", "We slip inside. Tomas and I push the altar aside."),
    ("tomas", "\u201cThe stairs are steep. Mind the seventh step, it is rotten.\u201d"),
    ("kai", "In the crypt there is a chest full of papers and a small iron box."),
    ("mira", "*Mira opens the ledger by the light of her lantern.* \u201cNames, dates, payments. And here: "
             "'Greywater ferry, forty silver, paid to T.'\u201d"),
    ("tomas", "\u201cForty silver,\u201d Tomas whispers. \u201cThat is what thirty years were worth to them.\u201d"),
    ("kai", "What's in the iron box?"),
    ("mira", "\u201cA seal. The Ash Guild's seal, with the hand,\u201d Mira says. \u201cThis is the proof.\u201d"),
    ("kai", "We take the ledger and the seal and climb back up."),
    ("tomas", "*On the seventh step Tomas's foot goes through the wood with a crack.*"),
    ("mira", "\u201cOf course,\u201d Mira hisses. \u201cThe seventh step.\u201d"),
    ("kai", "Outside the smugglers are waking up. We run for the river."),
    ("tomas", "\u201cMy skiff is hidden in the reeds. This way!\u201d"),
    ("kai", "We push off into the dark water as the first torches reach the bank."),
    ("mira", "\u201cRow, ferryman,\u201d Mira says. \u201cRow like it is thirty years ago.\u201d"),
    ("tomas", "*Tomas laughs for the first time, and rows.* \u201cThe river takes what it wants. Tonight it wants "
              "the Guild to lose.\u201d"),
    ("kai", "On the far bank we catch our breath. The torches stay on the other side."),
    ("mira", "\u201cHarrowgate is three days north. The magistrate will not ignore a Guild seal in a stranger's hand.\u201d"),
    ("kai", "Tomas, will you testify?"),
    ("tomas", "\u201cI will tell them what I did. Then maybe the river will forgive me.\u201d"),
    ("mira", "\u201cThe river does not forgive,\u201d Mira says softly. \u201cBut people sometimes do.\u201d"),
    ("kai", "We set off north at first light, the ledger wrapped in oilcloth in my pack."),
]
